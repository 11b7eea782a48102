"""Offline Hadamard rotation of the residual stream (``numerics.rotation = "residual"``).

An orthogonal ``R`` (``hidden x hidden``) applied to the residual stream, ``x' = x R``,
changes no float result of the model: RMSNorm is rotation-invariant (``rms(x R) =
rms(x)``) once its gain is folded into the projections that read it, and every write into
the stream is rotated with it. What it changes is the integer pipeline's view: the few
outlier channels that set each token's int8 scale are spread over all channels (the
QuaRot / SpinQuant observation; the vendor's 4-bit builds ship a rotated embedding table).

With row vectors: ``embed' = E R`` (the host's embedding table), ``W' = W diag(g) R`` for
q/k/v (``g`` = attn_norm's gain) and gate/up (mlp_norm's), ``W' = R^T W`` and ``b' = R^T b``
for o_proj/down_proj, the LM head ``E_head diag(g_final) R`` (untied from the embedding
table: the two differ once the final gain is folded), and every RMSNorm gain becomes 1.

``R`` is a normalised Hadamard matrix: a Kronecker product of Sylvester's ``2**a`` and
Paley's order-12 construction (hidden sizes ``2**a``, ``12 * 2**a`` and ``144 * 2**a``:
576 = 144 x 4 for SmolLM2-135M).

A LayerNorm (Cohere) centres its input, which a rotation does not keep in general; but a
Sylvester matrix's first row and column are constant, so the mean of ``x`` is ``x'[0] /
sqrt(n)`` and centring ``x`` is zeroing channel 0 of ``x'`` (LAYERNORM_WIDE's rotated
mode): LayerNorm models rotate when their hidden size is a power of two.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from kvsim.errors import ConfigError

from .. import exact
from ..config import ModelConfig
from ..weights import CachedWeights, WeightSource

#: Paley construction I needs a prime q = 3 mod 4; q = 11 gives order 12.
_PALEY_Q = 11


def _paley12() -> np.ndarray:
    q = _PALEY_Q
    squares = {(i * i) % q for i in range(1, q)}

    def chi(a: int) -> int:
        a %= q
        return 0 if a == 0 else (1 if a in squares else -1)

    jac = np.array([[chi(j - i) for j in range(q)] for i in range(q)], np.float64)
    s = np.zeros((q + 1, q + 1))
    s[0, 1:] = 1
    s[1:, 0] = -1
    s[1:, 1:] = jac
    return np.eye(q + 1) + s


@lru_cache(maxsize=4)
def hadamard(n: int) -> np.ndarray:
    """The orthonormal Hadamard matrix of order ``n`` (float64, ``H H^T = I``)."""
    return hadamard_signs(n) / np.sqrt(n)


def hadamard_signs(n: int) -> np.ndarray:
    """The Hadamard matrix of order ``n`` with entries +-1 (float64, ``H H^T = n I``)."""
    a, b = hadamard_factors(n)
    return np.kron(a, b)


def hadamard_factors(n: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`hadamard_signs` ``(n)`` as ``kron(a, b)`` of two +-1 matrices of orders near
    ``sqrt(n)``: the matrix is ``kron(P12, ..., P12, S2, ..., S2)`` (Paley's order 12, then
    Sylvester's order 2, whose Kronecker powers are Sylvester's ``2**a``), and ``a`` takes
    the leading factors whose order comes closest to ``sqrt(n)`` (576: 12 and 48; 4,096: 64
    and 64). A product with the pair costs ``order(a) + order(b)`` multiplies per element
    instead of ``n`` (:func:`models.exact.matmul_signs_kron`)."""
    twelves, rest = 0, n
    while rest % 12 == 0 and twelves < 2:
        rest //= 12
        twelves += 1
    if n < 1 or rest & (rest - 1):
        raise ConfigError(f"numerics.rotation: no Hadamard matrix of order {n} (kvsim builds "
                          "orders 2**a, 12 * 2**a and 144 * 2**a); use rotation = 'none'")
    sylvester_2 = np.array([[1.0, 1.0], [1.0, -1.0]])
    parts = [_paley12()] * twelves + [sylvester_2] * (rest.bit_length() - 1)
    cut = 0  # the leading parts whose order comes closest to sqrt(n)
    if parts:
        orders = np.cumprod([p.shape[0] for p in parts])
        cut = int(np.argmin(np.abs(np.log(orders) - np.log(n) / 2))) + 1
    a, b = np.ones((1, 1)), np.ones((1, 1))
    for p in parts[:cut]:
        a = np.kron(a, p)
    for p in parts[cut:]:
        b = np.kron(b, p)
    return a, b


def rotated_layer_norm(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm (no bias) of a Sylvester-rotated row ``x' = x R`` in the rotated space:
    centring ``x`` zeroes channel 0 of ``x'`` (the module docstring), the variance is the
    same; float32. The float twin of LAYERNORM_WIDE's rotated mode, for calibration."""
    xc = np.array(x, np.float32)
    xc[..., 0] = 0
    var = np.mean(np.square(xc), axis=-1, keepdims=True)
    return (xc / np.sqrt(var + np.float32(eps)) * gamma).astype(np.float32)


def _split(name: str) -> tuple[str, str]:
    """``layers.3.q_proj`` -> ``("layers.3.", "q_proj")``; globals -> ``("", name)``."""
    if name.startswith("layers."):
        head, _, leaf = name.rpartition(".")
        return head + ".", leaf
    return "", name


_READS_ATTN_NORM = ("q_proj", "k_proj", "v_proj")
_READS_MLP_NORM = ("gate_proj", "up_proj")
_WRITES_STREAM = ("o_proj", "down_proj")
_NORMS = ("attn_norm", "mlp_norm", "final_norm")
#: Name of the rotated LM head when the model ties it to the embedding table.
HEAD = "lm_head"


#: Rows rotated at a time (:meth:`RotatedWeights._rotate`).
ROTATE_ROWS = 4096

class RotatedWeights:
    """The float weights of ``source`` with the residual stream rotated (see the module
    docstring); :meth:`head` is the LM head, which no longer equals the embedding table."""

    def __init__(self, source: WeightSource):
        self.source = source
        self.config: ModelConfig = source.config
        self.factors = hadamard_factors(self.config.hidden_size)
        self._head: np.ndarray | None = None

    def tensor(self, name: str) -> np.ndarray:
        src = self.source
        pre, leaf = _split(name)
        if leaf in _NORMS:
            return np.ones(src.tensor(name).shape, np.float32)
        if name == "embed":
            return self._rotate(src.tensor("embed"))
        if name == HEAD:
            return self.head()
        if leaf in _READS_ATTN_NORM or leaf in _READS_MLP_NORM:
            # a parallel block's MLP reads the attention's norm (blocks/parallel.py)
            reads_attn = leaf in _READS_ATTN_NORM or self.config.parallel_block
            g = src.tensor(pre + ("attn_norm" if reads_attn else "mlp_norm"))
            return self._rotate(src.tensor(name), gain=g)
        if leaf in _WRITES_STREAM:
            return np.ascontiguousarray(self._rotate(src.tensor(name).T).T)
        if leaf == "o_bias":
            return self._rotate(src.tensor(name)[None, :])[0]
        return src.tensor(name)

    def _rotate(self, a: np.ndarray, gain: np.ndarray | None = None) -> np.ndarray:
        """``a diag(gain) R`` (``a`` ``[rows, hidden]``; ``gain`` a norm's, multiplied in
        float64), float32: the product with the +-1 matrix is exact
        (:func:`models.exact.matmul_signs_kron`, the bits of :func:`models.exact.matmul`:
        the same on every machine), then divided by ``sqrt(hidden)`` and rounded once.
        :data:`ROTATE_ROWS` rows at a time: each row's product and rounding are its own
        (models.exact splits per row), so the result is the whole product's without its
        float64 temporaries (~1 GB for SmolLM2's 49,152 x 576 embedding table at once)."""
        g = None if gain is None else np.asarray(gain, np.float64)[None, :]
        out = np.empty(a.shape, np.float32)
        for r0 in range(0, a.shape[0], ROTATE_ROWS):
            rows = np.asarray(a[r0:r0 + ROTATE_ROWS], np.float64)
            if g is not None:
                rows = rows * g
            y = exact.matmul_signs_kron(rows, list(self.factors))
            out[r0:r0 + ROTATE_ROWS] = y / np.sqrt(self.config.hidden_size)
        return out

    def head(self) -> np.ndarray:
        """The LM head ``W diag(g_final) R`` (``W`` = the embedding table when tied)."""
        if self._head is None:  # a vocabulary x hidden product: computed once
            cfg = self.config
            self._head = self._rotate(self.source.tensor(cfg.lm_head_tensor),
                                      gain=self.source.tensor("final_norm"))
            self._head.flags.writeable = False
        return self._head


def head_tensor(source: WeightSource) -> np.ndarray:
    """The LM head's float weights as the device holds them."""
    if isinstance(source, CachedWeights):
        source = source.source
    if isinstance(source, RotatedWeights):
        return source.head()
    return source.tensor(source.config.lm_head_tensor)
