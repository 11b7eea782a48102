"""Numba kernels: what every compute instruction computes, bit for bit, integers only.

Modules: :mod:`.fixed` (rounding, saturation, integer sqrt, host-side multipliers),
:mod:`.fpbits` (fp16/bf16 bit patterns <-> integers), :mod:`.pack` (2/4/8-bit packing),
:mod:`.matrix` (GEMV/GEMM and requantization), :mod:`.softmax` (I-BERT-style integer exp
and softmax), :mod:`.vector` (RMSNorm, SiLU/SwiGLU, residual add, RoPE, requantize),
:mod:`.kvquant` (group quantization of KV-cache values), :mod:`.attention` (GQA/MLA
integer attention), :mod:`.exact` (when float BLAS sums integers exactly).

Every function decorated ``@njit(cache=True)`` works on preallocated arrays; its slow numpy
reference lives in ``tests/isa/test_kernels_*.py``. Rounding is round half up everywhere
(see :mod:`.fixed`).
"""
