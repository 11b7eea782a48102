"""KV-cache formats: the names code outside :mod:`isa` imports as ``isa.kvformats``.

The formats live in the package :mod:`isa.kv` (format and validation, codec, DRAM region,
spec grammar); this module gathers their public names so that ``kvformats.parse``,
``kvformats.pair``, ``kvformats.to_text`` and ``kvformats.KVFormat`` keep working.
"""

from .kv.codec import KINDS, QuantizedKV
from .kv.format import AXES, BITS, DTYPE_BYTES, FP_DTYPES, SCALE_DTYPES, ZERO_DTYPES, KVFormat
from .kv.grammar import FORMATS, PAIRS, SPEC_HELP, KVPair, names, pair, parse, to_text
from .kv.region import RegionLayout

__all__ = [
    "AXES", "BITS", "DTYPE_BYTES", "FORMATS", "FP_DTYPES", "KINDS", "PAIRS", "SCALE_DTYPES",
    "SPEC_HELP", "ZERO_DTYPES", "KVFormat", "KVPair", "QuantizedKV", "RegionLayout", "names",
    "pair", "parse", "to_text",
]
