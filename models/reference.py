"""Float reference model: a plain numpy float64 forward pass of every supported architecture.

It is the yardstick for kvsim's integer programs: the compiler's decode must come close to
these logits, and accuracy studies compare its KV cache with quantized ones. It follows
the Hugging Face implementations (``LlamaModel``, ``Qwen2Model``, ``MistralModel``, and
DeepSeek-V2's ``modeling_deepseek.py``) term by term:

- token embedding, pre-norm blocks ``x + attn(rmsnorm(x))``, ``x + mlp(rmsnorm(x))``,
  final RMSNorm, LM head (the embedding matrix when tied);
- RMSNorm ``x / sqrt(mean(x^2) + eps) * gamma``;
- RoPE with ``rope_theta`` and the ``rope_scaling`` of the config (llama3, linear, or
  DeepSeek's YaRN), in the "rotate half" convention; DeepSeek-V2 stores its RoPE channels
  interleaved, and de-interleaves them before rotating, as its HF code does;
- GQA attention with a causal mask over the cache (keys cached after RoPE);
- MLA (DeepSeek-V2): the cache holds the normalised KV latent (``kv_lora_rank``) and the
  decoupled RoPE key (``qk_rope_head_dim``); per-head keys and values are expanded from
  the latent by ``k_b_proj`` and ``v_b_proj``; queries come from ``q_proj`` or from the
  ``q_a_proj -> q_a_norm -> q_b_proj`` low-rank path;
- SwiGLU MLP ``down(silu(gate(x)) * up(x))``; MoE (:meth:`ReferenceModel.route` for the
  DeepSeek-V2, Qwen2-MoE and Mixtral variants): softmax router scores, top-k experts
  (greedy or group-limited greedy), weights renormalised or scaled by
  ``routed_scaling_factor``, plus the shared experts; the first ``first_k_dense_replace``
  layers are dense;
- the per-layer features of :mod:`models.layer_features` (Cohere2's ``modeling_cohere2.py``,
  EXAONE-4.0's ``modeling_exaone4.py``): sliding-window layers (query ``p`` sees positions
  ``> p - sliding_window``; the reference keeps every token and masks, which gives the same
  result as keeping only the window), layers without RoPE, LayerNorm ``(x - mean) /
  sqrt(var + eps) * gamma`` (no bias), QK RMSNorm per head before RoPE, post-attention and
  post-MLP norms, the parallel block ``x + attn(n(x)) + mlp(n(x))`` and the logit scale;
  Gemma 3's (``modeling_gemma3.py``): norms on both sides of each branch, GeGLU, scaled
  embeddings and its attention scale (its norms' ``1 + w`` folded when weights are read).

The model computes in float64 (:data:`FLOAT`, numpy matmul on the float weights): a
float32 matrix product's last bits depend on the BLAS kernel the machine picks (its
summation order and FMA use differ between CPU generations), and those bits reached every
figure measured against the reference (KL, perplexity); in float64 the kernels differ by
~1e-16 relative, far below any figure kvsim reports. The small ops below keep their
input's dtype: the compiler's calibration passes call them in float32 (with the exact
products of :mod:`models.exact`). Past 2,048 rows, attention and the LM head run in blocks
of rows (:mod:`models.reference_blocks`), so a long text needs bounded memory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kvsim.errors import ConfigError

from .bits import WeightBits
from .config import LinearRopeScaling, Llama3RopeScaling, ModelConfig, YarnRopeScaling
from .reference_blocks import attend, head_logits, tail_rows
from .weights import SyntheticWeights, WeightSource, quantize_weight

#: The float passes' dtype (the reference model and the calibration passes of
#: :mod:`models.compiler`): float64, so that their results do not depend on the BLAS kernel.
FLOAT = np.float64

# --- RoPE -----------------------------------------------------------------------------------


def rope_dim(config: ModelConfig) -> int:
    """Channels RoPE rotates per head: ``head_dim`` (GQA) or ``qk_rope_head_dim`` (MLA)."""
    return config.qk_rope_head_dim if config.qk_rope_head_dim is not None else config.head_dim


def _yarn_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
    """Inverse frequencies (rad per position), float64 ``(rope_dim/2,)``, scaling applied."""
    d = rope_dim(config)
    base = config.rope_theta
    inv = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    rs = config.rope_scaling
    if rs is None:
        return inv
    if isinstance(rs, LinearRopeScaling):
        return inv / rs.factor
    if isinstance(rs, Llama3RopeScaling):
        # transformers.modeling_rope_utils._compute_llama3_parameters
        old = rs.original_max_position_embeddings
        low_wavelen = old / rs.low_freq_factor
        high_wavelen = old / rs.high_freq_factor
        wavelen = 2 * math.pi / inv
        out = np.where(wavelen > low_wavelen, inv / rs.factor, inv)
        smooth = (old / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
        smoothed = (1 - smooth) * out / rs.factor + smooth * out
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, smoothed, out)
    assert isinstance(rs, YarnRopeScaling)

    # DeepseekV2YarnRotaryEmbedding._set_cos_sin_cache
    def correction_dim(rotations: float) -> float:
        return (d * math.log(rs.original_max_position_embeddings / (rotations * 2 * math.pi))) / (
            2 * math.log(base)
        )

    low = max(math.floor(correction_dim(rs.beta_fast)), 0)
    high = min(math.ceil(correction_dim(rs.beta_slow)), d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extra_mask = 1.0 - ramp
    return inv / rs.factor * (1 - extra_mask) + inv * extra_mask


def rope_cos_sin(config: ModelConfig, positions: np.ndarray,
                 dtype: type = np.float32) -> tuple[np.ndarray, np.ndarray]:
    """``cos`` and ``sin`` tables, ``dtype`` ``(len(positions), rope_dim/2)``, for the given
    absolute token positions (YaRN's cos/sin magnitude factor included): float32 for the
    device's tables, :data:`FLOAT` for the float passes."""
    ang = np.asarray(positions, dtype=np.float64)[:, None] * rope_inv_freq(config)[None, :]
    mag = 1.0
    rs = config.rope_scaling
    if isinstance(rs, YarnRopeScaling):
        mag = _yarn_mscale(rs.factor, rs.mscale) / _yarn_mscale(rs.factor, rs.mscale_all_dim)
    return (np.cos(ang) * mag).astype(dtype), (np.sin(ang) * mag).astype(dtype)


def softmax_scale(config: ModelConfig) -> float:
    """Attention score scale: ``q_head_dim ** -0.5`` (``query_pre_attn_scalar ** -0.5``
    when given: Gemma), times ``mscale(factor, mscale_all_dim)^2`` under DeepSeek's YaRN."""
    scale = (config.q_head_dim if config.query_pre_attn_scalar is None
             else config.query_pre_attn_scalar) ** -0.5
    rs = config.rope_scaling
    if isinstance(rs, YarnRopeScaling) and rs.mscale_all_dim:
        m = _yarn_mscale(rs.factor, rs.mscale_all_dim)
        scale *= m * m
    return scale


def apply_rope(
    x: np.ndarray, cos: np.ndarray, sin: np.ndarray, *, interleaved: bool = False
) -> np.ndarray:
    """Rotate the last axis of ``x`` (``(n, ..., d)``) by the per-token ``cos``/``sin``
    (``(n, d/2)``) in the rotate-half convention: channel ``j`` pairs with ``j + d/2``.

    ``interleaved``: ``x`` stores pairs as ``(2j, 2j+1)`` (DeepSeek-V2); it is first
    de-interleaved to ``[0, 2, 4, ..., 1, 3, 5, ...]`` and the result stays in that order.
    """
    d = x.shape[-1]
    if interleaved:
        x = np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)
    extra = (slice(None),) + (None,) * (x.ndim - 2) + (slice(None),)
    c, s = cos[extra], sin[extra]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(x.dtype)


# --- small ops ------------------------------------------------------------------------------


def rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    """``x / sqrt(mean(x^2, last axis) + eps) * gamma`` in ``x``'s float dtype (float64
    in the reference, float32 in the calibration passes)."""
    ms = np.mean(np.square(x), axis=-1, keepdims=True)
    return (x / np.sqrt(ms + x.dtype.type(eps)) * gamma).astype(x.dtype)


def layer_norm(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    """``(x - mean) / sqrt(var + eps) * gamma`` over the last axis, no bias (CohereLayerNorm),
    in ``x``'s float dtype."""
    xc = x - np.mean(x, axis=-1, keepdims=True)
    var = np.mean(np.square(xc), axis=-1, keepdims=True)
    return (xc / np.sqrt(var + x.dtype.type(eps)) * gamma).astype(x.dtype)


def silu(x: np.ndarray) -> np.ndarray:
    """``x * sigmoid(x)`` in ``x``'s float dtype."""
    return (x / (1.0 + np.exp(-x))).astype(x.dtype)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU's tanh form ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (Hendrycks &
    Gimpel 2016; HF's ``gelu_pytorch_tanh``), in ``x``'s float dtype."""
    f = x.dtype.type
    inner = f(math.sqrt(2 / math.pi)) * (x + f(0.044715) * x * x * x)
    return (f(0.5) * x * (f(1) + np.tanh(inner))).astype(x.dtype)


def gate_activation(config: ModelConfig):
    """The MLP's gate activation: :func:`silu` (SwiGLU) or :func:`gelu_tanh` (GeGLU)."""
    return gelu_tanh if config.hidden_act == "gelu_tanh" else silu


def embed_rows(config: ModelConfig, table: np.ndarray, tokens) -> np.ndarray:
    """The host's embeddings: ``table``'s rows ``tokens``, float32, times ``embed_scale``."""
    rows = table[np.asarray(tokens)].astype(np.float32)
    scale = np.float32(config.embed_scale)
    return rows if scale == 1 else (rows * scale).astype(np.float32)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax in ``x``'s float dtype; ``-inf`` entries get probability
    0."""
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return (e / np.sum(e, axis=axis, keepdims=True)).astype(x.dtype)


# --- the model ------------------------------------------------------------------------------


class ReferenceModel:
    """Float (:data:`FLOAT`) forward pass with an internal KV cache.

    ``weights`` defaults to :class:`SyntheticWeights` with ``seed``. With ``weight_bits``
    every projection matrix is replaced by its quantize-dequantize image at the bits its
    role gets (:func:`models.weights.quantize_weight`), the reference for weight-only
    quantization error; the embedding lookup stays float (it runs on the host).

    Weights are cached after first use (``cache_weights=False`` fetches them every time).
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: WeightSource | None = None,
        *,
        seed: int = 0,
        weight_bits: WeightBits | None = None,
        cache_weights: bool = True,
    ):
        self.config = config
        self.weights = weights if weights is not None else SyntheticWeights(config, seed=seed)
        if self.weights.config != config:
            raise ConfigError("weights: the weight source was built for another model config")
        if config.rope_local_theta is not None:  # one RoPE table per model in kvsim
            raise ConfigError(f"model {config.name or config.family!r}: its sliding layers "
                              f"have their own RoPE (rope_local_theta "
                              f"{config.rope_local_theta:g}): timing only")
        self.weight_bits = weight_bits
        self.cache_weights = cache_weights
        self._wcache: dict[tuple[str, bool], np.ndarray] = {}
        self._scale = FLOAT(softmax_scale(config))
        #: Expert ids chosen per MoE layer by the last forward call, int ``(n, top_k)``.
        self.last_routing: dict[int, np.ndarray] = {}
        self._keep_kv = True  # _append keeps the K/V (see final_hidden)
        self.reset()

    # --- state ------------------------------------------------------------------------------

    def reset(self) -> None:
        """Empty the KV cache."""
        widths = self.config.kv_components()
        self._kv: list[dict[str, np.ndarray]] = [
            {k: np.zeros((0, w), dtype=FLOAT) for k, w in widths.items()}
            for _ in range(self.config.num_layers)
        ]

    @property
    def num_cached(self) -> int:
        """Tokens in the KV cache (the position of the next token)."""
        return int(next(iter(self._kv[0].values())).shape[0])

    def kv_cache(self) -> list[dict[str, np.ndarray]]:
        """A copy of the cache: per layer, per component (:meth:`ModelConfig.kv_components`),
        :data:`FLOAT` ``(tokens, width)``. GQA ``key``/``value`` rows are ``num_kv_heads`` heads
        of ``head_dim`` (head-major), keys after RoPE; MLA ``content`` is the normalised
        latent, ``rope`` the decoupled key after RoPE."""
        return [{k: v.copy() for k, v in layer.items()} for layer in self._kv]

    def set_kv_cache(self, cache: Sequence[dict[str, np.ndarray]]) -> None:
        """Replace the cache (e.g. by a dequantized one); shapes as :meth:`kv_cache` gives."""
        widths = self.config.kv_components()
        if len(cache) != self.config.num_layers:
            raise ConfigError(f"kv cache: {len(cache)} layers, model has {self.config.num_layers}")
        new: list[dict[str, np.ndarray]] = []
        tokens = None
        for i, layer in enumerate(cache):
            if set(layer) != set(widths):
                raise ConfigError(
                    f"kv cache layer {i}: components {sorted(layer)}, expected {sorted(widths)}"
                )
            arrs = {k: np.asarray(layer[k], dtype=FLOAT) for k in widths}
            for k, a in arrs.items():
                tokens = a.shape[0] if tokens is None else tokens
                if a.shape != (tokens, widths[k]):
                    raise ConfigError(
                        f"kv cache layer {i} {k}: shape {a.shape}, expected ({tokens}, {widths[k]})"
                    )
            new.append({k: a.copy() for k, a in arrs.items()})
        self._kv = new

    # --- weights ----------------------------------------------------------------------------

    def _w(self, name: str, *, quantized: bool = True) -> np.ndarray:
        use_q = quantized and self.weight_bits is not None
        if use_q and self.config.tensor_spec(name).kind != "matrix":
            use_q = False
        key = (name, use_q)
        w = self._wcache.get(key)
        if w is None:
            w = self.weights.tensor(name)
            if use_q:
                assert self.weight_bits is not None
                bits = self.weight_bits.bits_for(self.config.tensor_spec(name).role)
                w = quantize_weight(w, bits).dequantize()
            if self.cache_weights:
                self._wcache[key] = w
        return w

    def _linear(self, x: np.ndarray, name: str, bias: str | None = None) -> np.ndarray:
        y = x @ self._w(name).T
        if bias is not None:
            y = y + self._w(bias)
        return y.astype(FLOAT)

    # --- forward ----------------------------------------------------------------------------

    def embed(self, tokens: Sequence[int] | np.ndarray) -> np.ndarray:
        """Token embeddings, float32 ``(n, hidden_size)`` (the host's job on the NPU)."""
        t = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if t.size == 0:
            raise ConfigError("tokens: need at least one token")
        if t.min() < 0 or t.max() >= self.config.vocab_size:
            raise ConfigError(f"tokens: ids must lie in 0..{self.config.vocab_size - 1}")
        return embed_rows(self.config, self._w("embed", quantized=False), t)

    def forward_embeddings(
        self, x: np.ndarray, *, return_hidden: bool = False, last_only: bool = False,
        last_rows: int = 0,
    ) -> np.ndarray | tuple[np.ndarray, list[np.ndarray]]:
        """Run ``n`` input embeddings (float ``(n, hidden)``) at positions
        ``num_cached .. num_cached+n-1``, appending their K/V to the cache.

        Returns the logits, :data:`FLOAT` ``(n, vocab_size)`` (``last_only``: the last
        position's, ``last_rows``: the last that many, the same values); with
        ``return_hidden`` also the residual stream entering each block and after the last
        (``num_layers + 1`` arrays)."""
        hidden = self._blocks(x, keep=return_hidden)
        h = self._norm(hidden[-1], "final_norm")
        rows = 1 if last_only else last_rows
        logits = self.head_logits(tail_rows(h, rows) if rows else h)
        logits = logits[-rows:] if rows else logits
        return (logits, hidden) if return_hidden else logits

    def _blocks(self, x: np.ndarray, *, keep: bool = False) -> list[np.ndarray]:
        """The residual stream of embeddings ``x`` entering each block and after the last
        (only the last without ``keep``), their K/V appended to the cache."""
        c = self.config
        x = np.asarray(x, dtype=FLOAT)
        if x.ndim != 2 or x.shape[1] != c.hidden_size:
            raise ConfigError(f"embeddings: shape {x.shape}, expected (n, {c.hidden_size})")
        positions = np.arange(self.num_cached, self.num_cached + x.shape[0])
        cos, sin = rope_cos_sin(c, positions, FLOAT)
        hidden = [x]
        self.last_routing = {}
        for i in range(c.num_layers):
            p = f"layers.{i}."
            if c.parallel_block:  # Cohere: one norm, attention and MLP added together
                h = self._norm(x, p + "attn_norm")
                x = (x + self._gqa(i, h, cos, sin) + self._swiglu(p, h)).astype(FLOAT)
            elif c.norm_position != "pre":  # EXAONE-4.0 / Gemma: norm each branch's output
                sandwich = c.norm_position == "sandwich"  # Gemma: and each branch's input
                h = self._norm(x, p + "attn_norm") if sandwich else x
                attn = self._norm(self._gqa(i, h, cos, sin), p + "post_attn_norm")
                x = (x + attn).astype(FLOAT)
                h = self._norm(x, p + "mlp_norm") if sandwich else x
                x = (x + self._norm(self._swiglu(p, h), p + "post_mlp_norm")).astype(FLOAT)
            else:
                h = self._norm(x, p + "attn_norm")
                attn = self._mla(i, h, cos, sin) if c.is_mla else self._gqa(i, h, cos, sin)
                x = (x + attn).astype(FLOAT)
                h = self._norm(x, p + "mlp_norm")
                mlp = self._moe(i, h) if c.layer_is_moe(i) else self._swiglu(p, h)
                x = (x + mlp).astype(FLOAT)
            if keep:
                hidden.append(x)
        return hidden if keep else [x]

    def final_hidden(self, x: np.ndarray, *, keep_cache: bool = True) -> np.ndarray:
        """:meth:`forward_embeddings`' final-normed hidden states, :data:`FLOAT` ``(n,
        hidden)``: their :meth:`head_logits` are its logits, read a block at a time.
        ``keep_cache=False``: the cache is left as it was (each layer's K/V dropped once
        the layer is done: a whole text's float64 cache is 0.75 GB at 8,192 tokens of
        SmolLM2); the same hidden states."""
        self._keep_kv = keep_cache
        try:
            return self._norm(self._blocks(x)[-1], "final_norm")
        finally:
            self._keep_kv = True

    def head_logits(self, h: np.ndarray) -> np.ndarray:
        """The LM head over final-normed ``h`` ``(n, hidden)``: :data:`FLOAT` logits."""
        return head_logits(self.config, self._w(self.config.lm_head_tensor), h)

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        """The model's norm (RMSNorm, or LayerNorm for ``norm_kind = "layer"``)."""
        fn = layer_norm if self.config.norm_kind == "layer" else rms_norm
        return fn(x, self._w(name), self.config.rms_norm_eps)

    def forward(self, tokens: Sequence[int] | np.ndarray) -> np.ndarray:
        """Append ``tokens`` after the cached ones; logits :data:`FLOAT` ``(n, vocab_size)``."""
        out = self.forward_embeddings(self.embed(tokens))
        assert isinstance(out, np.ndarray)
        return out

    def prefill(self, tokens: Sequence[int] | np.ndarray) -> np.ndarray:
        """Empty the cache, then run ``tokens``; logits :data:`FLOAT` ``(n, vocab_size)``."""
        self.reset()
        return self.forward(tokens)

    def decode(self, token: int) -> np.ndarray:
        """Run one token after the cached ones; logits :data:`FLOAT` ``(vocab_size,)``."""
        return self.forward([token])[0]

    # --- blocks -----------------------------------------------------------------------------

    def _append(self, layer: int, **parts: np.ndarray) -> dict[str, np.ndarray]:
        """The layer's cache with ``parts`` appended, kept for the next call unless a
        :meth:`final_hidden` call without ``keep_cache`` runs."""
        cache = self._kv[layer] if self._keep_kv else dict(self._kv[layer])
        for k, v in parts.items():
            cache[k] = np.concatenate([cache[k], v.astype(FLOAT)], axis=0)
        return cache

    def _gqa(self, layer: int, h: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        c = self.config
        p = f"layers.{layer}."
        n, d = h.shape[0], c.head_dim
        qb, kb, vb = (p + "q_bias", p + "k_bias", p + "v_bias") if c.qkv_bias else (None,) * 3
        q = self._linear(h, p + "q_proj", qb).reshape(n, c.num_heads, d)
        k = self._linear(h, p + "k_proj", kb).reshape(n, c.num_kv_heads, d)
        v = self._linear(h, p + "v_proj", vb)
        if c.qk_norm:  # EXAONE-4.0: RMSNorm of each head, before RoPE
            q = rms_norm(q, self._w(p + "q_norm"), c.rms_norm_eps)
            k = rms_norm(k, self._w(p + "k_norm"), c.rms_norm_eps)
        if c.layer_has_rope(layer):
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
        cache = self._append(layer, key=k.reshape(n, -1), value=v)
        t = cache["key"].shape[0]
        group = c.num_heads // c.num_kv_heads
        keys = np.repeat(cache["key"].reshape(t, c.num_kv_heads, d), group, axis=1)
        values = np.repeat(cache["value"].reshape(t, c.num_kv_heads, d), group, axis=1)
        # causal over the cache (reference_blocks.attend: whole up to 2,048 queries)
        out = attend(q, keys, values, self._scale, c.layer_window(layer))
        return self._linear(out, p + "o_proj", p + "o_bias" if c.o_bias else None)

    def _mla(self, layer: int, h: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        c = self.config
        assert c.kv_lora_rank is not None and c.qk_nope_head_dim is not None
        assert c.qk_rope_head_dim is not None and c.v_head_dim is not None
        p = f"layers.{layer}."
        n, nope, heads = h.shape[0], c.qk_nope_head_dim, c.num_heads
        if c.q_lora_rank is None:
            q = self._linear(h, p + "q_proj")
        else:
            qa = rms_norm(self._linear(h, p + "q_a_proj"), self._w(p + "q_a_norm"), c.rms_norm_eps)
            q = self._linear(qa, p + "q_b_proj")
        q = q.reshape(n, heads, c.q_head_dim)
        q_nope, q_pe = q[..., :nope], apply_rope(q[..., nope:], cos, sin, interleaved=True)
        kv_a = self._linear(h, p + "kv_a_proj")
        latent = rms_norm(kv_a[:, : c.kv_lora_rank], self._w(p + "kv_a_norm"), c.rms_norm_eps)
        k_pe = apply_rope(kv_a[:, c.kv_lora_rank :], cos, sin, interleaved=True)
        cache = self._append(layer, content=latent, rope=k_pe)
        t = cache["content"].shape[0]
        k_nope = self._linear(cache["content"], p + "k_b_proj").reshape(t, heads, nope)
        values = self._linear(cache["content"], p + "v_b_proj").reshape(t, heads, c.v_head_dim)
        k_pe_all = np.broadcast_to(cache["rope"][:, None, :], (t, heads, c.qk_rope_head_dim))
        keys = np.concatenate([k_nope, k_pe_all], axis=-1)
        out = attend(np.concatenate([q_nope, q_pe], axis=-1), keys, values, self._scale)
        return self._linear(out, p + "o_proj")

    def _swiglu(self, prefix: str, h: np.ndarray) -> np.ndarray:
        gate = self._linear(h, prefix + "gate_proj")
        up = self._linear(h, prefix + "up_proj")
        return self._linear(gate_activation(self.config)(gate) * up, prefix + "down_proj")

    def route(self, layer: int, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """MoE routing of normed hidden states ``h`` (n, hidden) in layer ``layer``:
        :func:`route_logits` of its router's logits."""
        return route_logits(self.config, self._linear(h, f"layers.{layer}.router"))

    def _moe(self, layer: int, h: np.ndarray) -> np.ndarray:
        c = self.config
        p = f"layers.{layer}."
        ids, weights = self.route(layer, h)
        self.last_routing[layer] = ids
        out = np.zeros_like(h)
        for e in np.unique(ids):
            rows, slot = np.nonzero(ids == e)
            y = self._swiglu(f"{p}experts.{int(e)}.", h[rows])
            out[rows] += y * weights[rows, slot][:, None]
        if c.n_shared_experts:
            shared = self._swiglu(p + "shared.", h)
            if c.shared_expert_gate:  # Qwen2-MoE: sigmoid(shared_expert_gate(x)) * expert(x)
                gate = self._linear(h, p + "shared_gate")
                shared = shared / (FLOAT(1) + np.exp(-gate))
            out += shared
        return out.astype(FLOAT)


def route_logits(c: ModelConfig, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MoE routing from router logits ``(n, n_routed_experts)``: expert ids int ``(n,
    top_k)`` (best first; ties to the lower id) and their weights ``(n, top_k)`` (the
    logits' float dtype): softmax over every expert's router logit, the top
    ``num_experts_per_tok``, then (DeepSeek-V2's ``MoEGate``) renormalised when
    ``norm_topk_prob`` and top_k > 1, else scaled by ``routed_scaling_factor``; Qwen2-MoE
    (``Qwen2MoeSparseMoeBlock``) renormalises when ``norm_topk_prob`` at any top_k and
    never scales; Mixtral (``MixtralSparseMoeBlock``) always renormalises (its import sets
    ``norm_topk_prob``), which equals its softmax over the top-k logits."""
    assert c.n_routed_experts is not None and c.num_experts_per_tok is not None
    k = c.num_experts_per_tok
    scores = softmax(logits, axis=-1)
    select = scores
    if c.topk_method == "group_limited_greedy":
        n = logits.shape[0]
        group_scores = scores.reshape(n, c.n_group, -1).max(axis=-1)
        top_groups = np.argsort(-group_scores, axis=-1, kind="stable")[:, : c.topk_group]
        keep = np.zeros((n, c.n_group), dtype=bool)
        np.put_along_axis(keep, top_groups, True, axis=-1)
        mask = np.repeat(keep, c.n_routed_experts // c.n_group, axis=-1)
        select = np.where(mask, scores, scores.dtype.type(0))
    ids = np.argsort(-select, axis=-1, kind="stable")[:, :k]
    weights = np.take_along_axis(select, ids, axis=-1)
    if c.family != "deepseek_v2":
        if c.norm_topk_prob:
            weights = weights / weights.sum(axis=-1, keepdims=True)
    elif k > 1 and c.norm_topk_prob:
        weights = weights / (weights.sum(axis=-1, keepdims=True) + scores.dtype.type(1e-20))
    else:
        weights = weights * scores.dtype.type(c.routed_scaling_factor)
    return ids, weights.astype(scores.dtype)
