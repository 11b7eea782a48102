"""KV-cache formats, split by concern:

- :mod:`isa.kv.format`: :class:`KVFormat`, its fields and their validation, record sizes;
- :mod:`isa.kv.codec`: int8 values to records and back (quantize, pack, unpack);
- :mod:`isa.kv.region`: a cache's DRAM region (sink slots, quantized slots, the ring of
  full-precision tail slots, truncation, sliding-window rings), its reads and writes;
- :mod:`isa.kv.header`: a region's header (token count; a ring's first held position);
- :mod:`isa.kv.traffic`: the DRAM bytes those reads and appends move, and a cache's size;
- :mod:`isa.kv.grammar`: the registry of named formats and the spec-string grammar.

Code outside :mod:`isa.kv` imports their public names from :mod:`isa.kvformats`; the package
itself re-exports nothing, so its modules import one another without passing through it.

Inputs are int8 values: on the device the K/V projections requantize to int8 (with the
static per-tensor or per-channel scale the compiler chose) before :class:`~isa.KvWrite`, so
every format quantizes int8 values, and every read gives int8 values back (the integer
dequantization of :mod:`isa.kernels.kvquant`; the dequantize-on-read path,
:meth:`KVFormat.region_read_q24`, gives the exact dequantized values unrounded).
Consequently the 16-bit formats (``bf16``, ``fp16``) and full-precision tokens hold those
int8 values exactly: they cost 2 bytes per value and lose nothing. (Attention over a bf16
cache thus reads the exact int8 grid back; a host edit that wrote a non-integer bf16 value
reads back rounded half up and saturated.)
"""
