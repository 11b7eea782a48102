"""The shapes of an MLA layer (DeepSeek-V2): its dimensions, its cache record, the KV
layouts that can hold it, and the work splits and operand views the stages share
(:mod:`.mla` describes the stages)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from isa import kvformats
from kvsim.errors import KvsimError

from ...config import ModelConfig
from ..builder import Matrix, split
from ..lowering import Lowering
from ..numerics import LayerQ, MlaQ


@dataclass(frozen=True)
class MlaDims:
    h: int  # hidden size
    heads: int
    nope: int  # qk_nope_head_dim
    rope: int  # qk_rope_head_dim
    kvr: int  # kv_lora_rank
    v: int  # v_head_dim
    qr: int  # q_lora_rank, 0 = no query latent

    @property
    def qhd(self) -> int:  # query head width (q_proj rows per head)
        return self.nope + self.rope

    @property
    def w(self) -> int:  # cache record and attention head width
        return self.kvr + self.rope

    @classmethod
    def of(cls, cfg: ModelConfig) -> MlaDims:
        assert cfg.kv_lora_rank is not None and cfg.qk_rope_head_dim is not None
        assert cfg.qk_nope_head_dim is not None and cfg.v_head_dim is not None
        return cls(cfg.hidden_size, cfg.num_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
                   cfg.kv_lora_rank, cfg.v_head_dim, cfg.q_lora_rank or 0)


def mla_record_width(cfg: ModelConfig) -> int:
    """Values per token of an MLA cache record: ``kv_lora_rank + qk_rope_head_dim``."""
    return MlaDims.of(cfg).w


def mla_kv_problem(cfg: ModelConfig, kv: str) -> str | None:
    """Why KV layout ``kv`` cannot hold ``cfg``'s MLA cache, or None: the cache is one
    record per token, so K and V must be one format, and a format that quantizes a RoPE
    part must cut it where the model's RoPE key is."""
    try:
        pair = kvformats.pair(kv)
    except KvsimError as err:
        return str(err)
    if pair.k != pair.v:
        return (f"{kv!r} has different K and V formats; an MLA model keeps one "
                f"[latent | rope key] cache per layer, so it needs one format")
    rope = pair.k.rope_width
    if rope and rope != cfg.qk_rope_head_dim:
        return (f"{kv!r} quantizes the last {rope} values of a record as the RoPE key; "
                f"model {cfg.name!r} has qk_rope_head_dim {cfg.qk_rope_head_dim}")
    return None


def cache_owner(lw: Lowering, layer: int) -> int:
    """The core that appends layer ``layer``'s cache and attends over it in a decode step
    (rotating with the layer)."""
    cores = lw.target.cores
    return cores[layer % len(cores)]


def q_matrix(lw: Lowering, layer: int, q) -> Matrix:
    name = "q_b_proj" if lw.model.q_lora_rank else "q_proj"
    return lw.matrix(f"layers.{layer}.{name}", q.q)


def absorbed_matrix(lw: Lowering, layer: int, q, head: int) -> Matrix:
    """Head ``head``'s block of ``k_b_proj`` as the absorption GEMM's operand: n =
    kv_lora_rank outputs of k = qk_nope_head_dim inputs (the same bytes), with its own
    multipliers (``p.layers.<i>.k_b_proj.absorbed``)."""
    d = MlaDims.of(lw.model)
    kb = lw.matrix(f"layers.{layer}.k_b_proj", q.k)
    p = lw.mm[absorbed_params_region(layer)].base
    return Matrix(f"{kb.name}[head {head}]", d.kvr, d.nope, kb.bits,
                  kb.w_addr + head * d.nope * kb.row_bytes, p + 8 * d.kvr * head, False,
                  True, mla_params(q).k_b.shift)


#: ``(mult, shift)`` of the REQUANT after the latent's RMSNORM_WIDE: the identity, as the
#: norm's int16 gain already maps its int32 output onto the latent's int8 grid
#: (``mla_calib``: the gain of an int8 RMSNorm from an int32 input); REQUANT saturates.
LATENT_REQUANT = (1, 0)


def latent_matrix(mkv: Matrix) -> Matrix:
    """``kv_a_proj`` (``mkv``) as its latent rows' GEMM reads it: a GemmRow with a static
    input and int32 outputs (the multipliers put every latent column on one int32 step)."""
    return replace(mkv, gemm_row=True, out_bits=32)


def mla_params(q: LayerQ) -> MlaQ:
    """Layer ``q``'s MLA parameters (defaults, as placeholders, in a timing-only compile)."""
    return q.mla if q.mla is not None else MlaQ()


def absorbed_params_region(layer: int) -> str:
    return f"p.layers.{layer}.k_b_proj.absorbed"


def head_split(lw: Lowering, layer: int, q) -> dict[int, list[int]]:
    """core -> query heads of stage A: each head to the core with the fewest weight bytes
    so far, the cache owner starting with its ``kv_a_proj`` bytes."""
    d = MlaDims.of(lw.model)
    mq = q_matrix(lw, layer, q)
    kb = lw.matrix(f"layers.{layer}.k_b_proj", q.k)
    kv = lw.matrix(f"layers.{layer}.kv_a_proj", q.k)
    per_head = d.qhd * mq.row_bytes + d.nope * kb.row_bytes
    cores = lw.target.cores
    load = {c: 0 for c in cores}
    load[cache_owner(lw, layer)] += kv.n * kv.row_bytes
    out: dict[int, list[int]] = {c: [] for c in cores}
    for hd in range(d.heads):
        c = min(cores, key=lambda c: (load[c], cores.index(c)))
        out[c].append(hd)
        load[c] += per_head
    return out


def attn_groups(lw: Lowering, layer: int, m: int) -> list[tuple[int, int, int]]:
    """(core, first head, end head) of stage B: the cache owner alone for one token, the
    heads split over the cores for more."""
    heads = lw.model.num_heads
    if m == 1:
        return [(cache_owner(lw, layer), 0, heads)]
    cores = lw.target.cores[: min(len(lw.target.cores), heads)]
    return [(c, a, e) for c, (a, e) in zip(cores, split(heads, len(cores)), strict=True)
            if e > a]




def mla_attention_bytes(fmt, ctx: int, width: int) -> tuple[int, int]:
    """(k_nbytes, v_nbytes) of an MLA ``Attn``: the bytes a read of the whole cache moves
    (header and records, :meth:`KVFormat.read_bytes`), streamed once, split in halves over
    the instruction's two streams."""
    total = fmt.read_bytes(0, ctx, width)
    return total - total // 2, total // 2

