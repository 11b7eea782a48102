"""Functional semantics of the KV-cache instructions (``isa.semantics`` dispatches them
here): ``kv.write``, ``kv.read`` and the attention instructions ``attn`` (integer) and
``attn.dq`` (dequantize-on-read), over a cache region in DRAM in its format's layout
(:mod:`isa.kv`), sliding-window rings included."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .errors import IsaError
from .instructions import Attn, AttnDq, KvRead, KvWrite, Space, f32_value
from .kernels import attention as katt
from .kernels import attention_fp as katf
from .kernels.fpbits import Q as Q24
from .kv.format import KVFormat
from .kv.grammar import parse

if TYPE_CHECKING:
    from .semantics import Memory


def _sram(mem: Memory, core: int, addr: int, nbytes: int, dtype=np.int8) -> np.ndarray:
    return mem.read(Space.SRAM, core, addr, nbytes).view(dtype)


def _region(mem: Memory, fmt: KVFormat, base: int, cap: int, width: int,
            what: str) -> np.ndarray:
    """The bytes of the cache region of ``cap`` tokens at DRAM ``base`` (a copy)."""
    if cap <= 0:
        raise IsaError(f"{what}: the cache capacity (cap) must be given")
    return mem.read(Space.DRAM, 0, base, fmt.region_bytes(cap, width))


def _check_nbytes(what: str, fmt: KVFormat, cap: int, width: int,
                  nbytes: int) -> None:
    need = fmt.region_bytes(cap, width)
    if nbytes != need:
        raise IsaError(f"{what}: a {fmt} region of {cap} tokens of width {width} is {need} "
                       f"bytes (KVFormat.region_bytes), the instruction says {nbytes}")


def kv_write(ins: KvWrite, mem: Memory, fmt: KVFormat) -> None:
    _check_nbytes("kv.write", fmt, ins.cap, ins.width, ins.nbytes)
    new = _sram(mem, ins.core, ins.src, ins.tokens * ins.width).reshape(ins.tokens, ins.width)
    region = _region(mem, fmt, ins.dst, ins.cap, ins.width, "kv.write")
    patches = sorted(fmt.region_write(region, ins.cap, ins.pos, new))
    merged: list[list[int]] = []
    for off, n in patches:  # region holds the final bytes: write each touched range once
        if merged and off <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], off + n)
        else:
            merged.append([off, off + n])
    for a, b in merged:
        mem.write(Space.DRAM, 0, ins.dst + a, region[a:b])


def kv_read(ins: KvRead, mem: Memory, fmt: KVFormat) -> None:
    _check_nbytes("kv.read", fmt, ins.cap, ins.width, ins.nbytes)
    region = _region(mem, fmt, ins.src, ins.cap, ins.width, "kv.read")
    vals = fmt.region_read(region, ins.cap, ins.width, ins.pos, ins.tokens)
    mem.write(Space.SRAM, ins.core, ins.dst, vals.reshape(-1).view(np.uint8))


def _q_k_v(a: Attn | AttnDq, mem: Memory, kf: KVFormat, vf: KVFormat, what: str,
           q24: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The query (int8, ``q_len x heads x head_dim``) and the ``ctx`` keys and values an
    attention instruction reads from its caches: stored values, or with ``q24`` their
    Q24 values (dequantize-on-read). A sliding-window cache (ring): ``ctx`` and ``pos``
    count from the first of its last ``ctx`` keys."""
    dk = a.head_dim
    q = _sram(mem, a.core, a.q, a.q_len * a.heads * dk).reshape(a.q_len, a.heads, dk)
    width = a.kv_heads * dk
    if kf.slide != vf.slide:
        raise IsaError(f"{what}: K format {kf} and V format {vf} have different windows")
    kreg = _region(mem, kf, a.k, a.cap, width, what)
    first = kf.region_first(kreg, a.cap, a.ctx)
    read = kf.region_read_q24 if q24 else kf.region_read
    k = read(kreg, a.cap, width, first, a.ctx).reshape(a.ctx, a.kv_heads, dk)
    if kf == vf and a.k <= a.v < a.k + kreg.size:  # MLA: the latent cache is K and V
        return q, k, k
    vreg = _region(mem, vf, a.v, a.cap, width, what)
    if vf.region_first(vreg, a.cap, a.ctx) != first:
        raise IsaError(f"{what}: the K and V caches hold different positions")
    read = vf.region_read_q24 if q24 else vf.region_read
    return q, k, read(vreg, a.cap, width, first, a.ctx).reshape(a.ctx, a.kv_heads, dk)


def _attend_window(attend, q: np.ndarray, k: np.ndarray, v: np.ndarray, pos: int,
                   window: int, **kw) -> np.ndarray:
    """``attend(q, k, v, pos=..., **kw)`` with query ``i`` (position ``pos + i``) seeing
    the keys up to its own, or only the last ``window`` of them (``window`` 0: all)."""
    q_len = q.shape[0]
    if not window or pos + q_len <= window:  # every query sees all keys up to its own
        return attend(q, k, v, pos=pos, **kw)
    out = np.empty((q_len, q.shape[1], v.shape[2]), np.int8)
    for i in range(q_len):
        p = pos + i
        lo = max(0, p - window + 1)
        out[i:i + 1] = attend(q[i:i + 1], k[lo:p + 1], v[lo:p + 1], pos=p - lo, **kw)
    return out


def attn(a: Attn, mem: Memory, kf: KVFormat, vf: KVFormat) -> None:
    q, k, v = _q_k_v(a, mem, kf, vf, "attn", q24=False)
    out = _attend_window(katt.attend, q, k, v, a.pos, kf.slide, score_mult=a.score_mult,
                         score_shift=a.score_shift, out_mult=a.out_mult,
                         out_shift=a.out_shift)
    mem.write(Space.SRAM, a.core, a.out, out.reshape(-1).view(np.uint8))


def fp16_values(x: np.ndarray, scale: float) -> np.ndarray:
    """The dequant pass: ``fp16(x * scale)`` (x in float64), as float32 arrays."""
    return (np.asarray(x, np.float64) * scale).astype(np.float16).astype(np.float32)


def attn_dq(a: AttnDq, mem: Memory, kf: KVFormat, vf: KVFormat) -> None:
    q, kq, vq = _q_k_v(a, mem, kf, vf, "attn.dq", q24=True)
    grid = 2.0 ** -Q24  # Q24 int8-grid units -> int8-grid units
    qf = fp16_values(q, f32_value(a.q_scale_f32))
    kf16 = fp16_values(kq, grid * f32_value(a.k_scale_f32))
    vf16 = fp16_values(vq, grid * f32_value(a.v_scale_f32))
    try:
        out = _attend_window(katf.attend_fp, qf, kf16, vf16, a.pos, kf.slide,
                             scale=f32_value(a.softmax_scale_f32),
                             out_scale=f32_value(a.out_scale_f32))
    except ValueError as err:
        raise IsaError(str(err)) from None
    mem.write(Space.SRAM, a.core, a.out, out.reshape(-1).view(np.uint8))


_FORMATS: dict[str, KVFormat] = {}


def format_of(formats: tuple[str, ...], index: int) -> KVFormat:
    if index >= len(formats):
        raise IsaError(f"format index {index} is not in the program's table of "
                       f"{len(formats)} formats")
    text = formats[index]
    fmt = _FORMATS.get(text)
    if fmt is None:
        fmt = _FORMATS[text] = parse(text)
    return fmt


__all__ = ["attn", "attn_dq", "format_of", "fp16_values", "kv_read", "kv_write"]
