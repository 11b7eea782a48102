"""Accuracy of the integer attention path against a float reference, for any KV format.

The integer path is the device's: float Q/K/V are quantized to int8 with a static
symmetric per-tensor scale (``absmax / 127``, as a calibrated compiler would), K and V are
written to caches in their formats and read back (:meth:`KVFormat.round_trip`: a DRAM
region written at once and read, as the device does), the integer attention kernel runs
(:func:`isa.kernels.attention.attend`) with multipliers from the float scales, and its int8
output is scaled back to float (output scale calibrated on the float reference, again as a
compiler would). The float reference is plain float64 softmax attention on the unquantized
inputs. Errors therefore include the int8 front end and the integer softmax, and the part a
KV format adds on top.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .kernels.attention import attend
from .kernels.fixed import quantize_multiplier
from .kernels.softmax import F, P
from .kvformats import KVFormat, parse


def rel_l2(x: np.ndarray, ref: np.ndarray) -> float:
    """``||x - ref|| / ||ref||`` (0 when both are zero)."""
    x = np.asarray(x, np.float64)
    ref = np.asarray(ref, np.float64)
    den = float(np.linalg.norm(ref))
    num = float(np.linalg.norm(x - ref))
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def cosine(x: np.ndarray, ref: np.ndarray) -> float:
    """Cosine similarity of the flattened arrays (1 when both are zero)."""
    a = np.asarray(x, np.float64).ravel()
    b = np.asarray(ref, np.float64).ravel()
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(a @ b) / (na * nb)


def attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, *,
                        pos: int | None = None) -> np.ndarray:
    """Float64 causal GQA attention: q ``[L, H, Dk]``, k ``[T, KH, Dk]``, v ``[T, KH, Dv]``;
    query ``i`` at position ``pos + i`` (default ``T - L``). Returns ``[L, H, Dv]``."""
    q = np.asarray(q, np.float64)
    k = np.asarray(k, np.float64)
    v = np.asarray(v, np.float64)
    L, H, dk = q.shape
    T, KH, _ = k.shape
    pos = T - L if pos is None else pos
    group = H // KH
    out = np.zeros((L, H, v.shape[2]))
    for i in range(L):
        n = min(T, pos + i + 1)
        for h in range(H):
            s = k[:n, h // group] @ q[i, h] / math.sqrt(dk)
            p = np.exp(s - s.max())
            out[i, h] = (p / p.sum()) @ v[:n, h // group]
    return out


def quantize_int8(x: np.ndarray) -> tuple[np.ndarray, float]:
    """Symmetric per-tensor int8: ``(round(x / s), s)`` with ``s = absmax / 127``."""
    x = np.asarray(x, np.float64)
    amax = float(np.max(np.abs(x))) if x.size else 0.0
    s = amax / 127.0 if amax > 0 else 1.0
    return np.clip(np.rint(x / s), -127, 127).astype(np.int8), s


def _fmt(f: KVFormat | str, role: str) -> KVFormat:
    return f if isinstance(f, KVFormat) else parse(f, role)


def through_cache(fmt: KVFormat, x8: np.ndarray) -> np.ndarray:
    """int8 ``[T, ...]`` written to a cache of ``fmt`` and read back (same shape)."""
    flat = np.ascontiguousarray(x8.reshape(x8.shape[0], -1))
    return fmt.round_trip(flat).reshape(x8.shape)


def _multipliers(s_q: float, s_k: float, s_v: float, s_out: float, dk: int) -> dict:
    sm, ss = quantize_multiplier(s_q * s_k / math.sqrt(dk) * (1 << F))
    om, osh = quantize_multiplier(s_v / s_out / (1 << P))
    return {"score_mult": sm, "score_shift": ss, "out_mult": om, "out_shift": osh}


def integer_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                      k_fmt: KVFormat | str, v_fmt: KVFormat | str, *,
                      pos: int | None = None, out_scale: float | None = None) -> np.ndarray:
    """The device's attention of float inputs (see the module docstring), as float
    ``[L, H, Dv]``. ``out_scale`` defaults to the float reference's ``absmax / 127``."""
    L = q.shape[0]
    T = k.shape[0]
    pos = T - L if pos is None else pos
    q8, s_q = quantize_int8(q)
    k8, s_k = quantize_int8(k)
    v8, s_v = quantize_int8(v)
    k8 = through_cache(_fmt(k_fmt, "k"), k8)
    v8 = through_cache(_fmt(v_fmt, "v"), v8)
    if out_scale is None:
        amax = float(np.max(np.abs(attention_reference(q, k, v, pos=pos))))
        out_scale = amax / 127.0 if amax > 0 else 1.0
    out8 = attend(q8, k8, v8, pos=pos, **_multipliers(s_q, s_k, s_v, out_scale, q.shape[2]))
    return out8.astype(np.float64) * out_scale


@dataclass(frozen=True)
class AttentionAccuracy:
    """Error of the integer attention output against the float reference."""

    k_format: str
    v_format: str
    rel_l2: float
    cosine: float


def attention_accuracy(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                       k_fmt: KVFormat | str, v_fmt: KVFormat | str, *,
                       pos: int | None = None) -> AttentionAccuracy:
    """Relative L2 error and cosine similarity of :func:`integer_attention` against
    :func:`attention_reference` on the same float inputs."""
    kf, vf = _fmt(k_fmt, "k"), _fmt(v_fmt, "v")
    ref = attention_reference(q, k, v, pos=pos)
    out = integer_attention(q, k, v, kf, vf, pos=pos)
    return AttentionAccuracy(str(kf), str(vf), rel_l2(out, ref), cosine(out, ref))


def mla_attention_accuracy(q: np.ndarray, cache: np.ndarray, fmt: KVFormat | str, *,
                           v_dim: int, pos: int | None = None) -> AttentionAccuracy:
    """MLA (absorbed) attention accuracy: q ``[L, H, Dk]``, the float latent+RoPE cache
    ``[T, Dk]`` whose first ``v_dim`` columns are the value."""
    f = _fmt(fmt, "k")
    k = cache[:, None, :]
    v = cache[:, None, :v_dim]
    ref = attention_reference(q, k, v, pos=pos)
    L, T = q.shape[0], cache.shape[0]
    pos = T - L if pos is None else pos
    q8, s_q = quantize_int8(q)
    c8, s_c = quantize_int8(cache)
    c8 = through_cache(f, c8)
    amax = float(np.max(np.abs(ref)))
    s_out = amax / 127.0 if amax > 0 else 1.0
    out8 = attend(q8, c8[:, None, :], c8[:, None, :v_dim], pos=pos,
                  **_multipliers(s_q, s_c, s_c, s_out, q.shape[2]))
    out = out8.astype(np.float64) * s_out
    return AttentionAccuracy(str(f), str(f), rel_l2(out, ref), cosine(out, ref))


def cache_error(fmt: KVFormat | str, x: np.ndarray) -> float:
    """Relative L2 error of float values ``x[T, W]`` after int8 quantization and a round
    trip through a cache of ``fmt``."""
    x8, s = quantize_int8(x)
    back = through_cache(_fmt(fmt, "k"), x8)
    return rel_l2(back.astype(np.float64) * s, x)
