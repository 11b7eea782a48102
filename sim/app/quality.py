"""Quality measured on the simulated NPU: a text teacher-forced through the integer pipeline
(functional mode, all-position logits) against the float reference on the same float
weights (the metrics: :mod:`models.quality`)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from isa import kvformats
from kvsim.errors import ConfigError
from models.bits import (
    WEIGHT_BITS_PRESETS,
    BitConfig,
    build_numerics,
    default_numerics,
    weight_bits_preset,
)
from models.compiler.calibrate_wide import float_weights
from models.compiler.compiled import CompiledModel
from models.quality import Quality, QualityStream
from models.reference import ReferenceModel
from models.reference_blocks import HEAD_ROWS, head_logits, row_blocks
from models.source import ModelSource
from sim.device.hw import HardwareConfig
from sim.runtime import Model, ModelConfig
from sim.runtime.cacheops import (
    CacheOpError,
    CacheView,
    EditFn,
    EditResult,
    as_layout,
    evict_positions,
    requantize_program,
    requantize_through,
    score_eviction,
)
from sim.runtime.ready import ReadyModel, hardware_of, ready_model, source_of, weights_key

#: Tokens per teacher-forced prefill call (a longer text runs as consecutive calls, each
#: returning the logits of all its positions).
CHUNK_TOKENS = 256
#: Cache lengths are rounded up to this many tokens (a multiple of every KV format's
#: token group).
CACHE_ROUND_TOKENS = 128


def bits_label(bits: BitConfig) -> str:
    """The weight-bit preset's name (``W8``), or the per-role bits when it is none."""
    for name, wb in WEIGHT_BITS_PRESETS.items():
        if wb == bits.weights:
            return name
    return ",".join(f"{k}={v}" for k, v in bits.weights.model_dump().items())


def bit_config(bits: str = "W8", *, numerics: str | None = None,
               kv_read: str = "integer", real_weights: bool = True) -> BitConfig:
    """A :class:`BitConfig` from the names a command line gives: the weight-bit preset,
    the numerics preset (None: :func:`models.bits.default_numerics` of the weights) and
    the KV read path."""
    if kv_read not in ("integer", "dequant"):
        raise ConfigError(f"kv_read: {kv_read!r} is not one of integer, dequant")
    opts = (default_numerics(real_weights) if numerics is None
            else build_numerics({"preset": numerics}, where="numerics"))
    return BitConfig(weights=weight_bits_preset(bits, where="bits"), numerics=opts,
                     kv_read=kv_read)


def check_context(src: ModelSource, tokens: int, what: str) -> None:
    """Refuse, before anything is compiled, a text whose ``tokens`` positions exceed the
    model's context (``max_position_embeddings``); ``what`` says what the tokens are."""
    limit = src.config.max_position_embeddings
    if tokens > limit:
        raise ConfigError(f"{what} tokens exceed the {limit:,}-token context of model "
                          f"{src.name!r} (max_position_embeddings)")


def ready_for_text(src: ModelSource, bits: BitConfig, *, kv: str, hw: HardwareConfig,
                   tokens: int, seed: int = 0, chunk_tokens: int = CHUNK_TOKENS,
                   functional: bool = True) -> ReadyModel:
    """``src`` ready (compiled, functional by default) for a text of ``tokens`` tokens, on
    every core of ``hw``, in calls of up to ``chunk_tokens``."""
    cap = -(-tokens // CACHE_ROUND_TOKENS) * CACHE_ROUND_TOKENS
    return ready_model(src, hw, bits=bits, kv=kv, max_seq=min(tokens, chunk_tokens), cap=cap,
                       functional=functional, seed=seed)


#: How many float references :func:`reference_rows` keeps (each the text's final hidden
#: states, ``n x hidden`` float64: 38 MB for 8,192 tokens of SmolLM2, and its LM head).
REFERENCES_KEPT = 2


class ReferenceRows:
    """The float reference's teacher-forced logits of one text, read a block of rows at a
    time (``rows(lo, hi)``: rows ``lo .. hi-1`` of the ``(n, vocab)`` logits) from its
    final hidden states. The LM head runs over the blocks of
    :func:`models.reference_blocks.row_blocks` whatever blocks are asked for (one product
    up to :data:`models.reference_blocks.WHOLE_ROWS` rows, the same logits as one whole
    prefill), so a row's value does not depend on the caller's blocks; past that, a long
    text's logits are never held at once (one block is kept)."""

    def __init__(self, config, hidden: np.ndarray, head: np.ndarray):
        self.config = config
        self.hidden = hidden
        self.head = head
        hidden.setflags(write=False)
        self._blocks = row_blocks(self.n, HEAD_ROWS)
        self._kept: tuple[int, int, np.ndarray] | None = None

    @property
    def n(self) -> int:
        return int(self.hidden.shape[0])

    def _block(self, i: int) -> tuple[int, int, np.ndarray]:
        lo, hi = self._blocks[i]
        if self._kept is None or self._kept[0] != lo:
            self._kept = (lo, hi, head_logits(self.config, self.head, self.hidden[lo:hi]))
        return self._kept

    def rows(self, lo: int, hi: int) -> np.ndarray:
        if not 0 <= lo <= hi <= self.n:
            raise ValueError(f"rows {lo}..{hi}: outside the text's {self.n} positions")
        parts = []
        for i, (blo, bhi) in enumerate(self._blocks):
            if blo < hi and lo < bhi:
                b0, _, logits = self._block(i)
                parts.append(logits[max(lo, blo) - b0 : min(hi, bhi) - b0])
        out = parts[0] if len(parts) == 1 else np.concatenate(parts)
        out = out.view()
        out.setflags(write=False)
        return out


class GivenRows:
    """:class:`ReferenceRows`' interface over logits already computed."""

    def __init__(self, logits: np.ndarray):
        self.logits = logits

    def rows(self, lo: int, hi: int) -> np.ndarray:
        return self.logits[lo:hi]


#: ``(key, rows)`` of the last :data:`REFERENCES_KEPT` references, newest last.
_REFERENCES: list[tuple[tuple, ReferenceRows]] = []
#: How many :class:`Quality` results :func:`evaluate` keeps (a few hundred bytes each).
QUALITIES_KEPT = 64
#: key -> quality of the last :data:`QUALITIES_KEPT` evaluations, oldest first.
_QUALITIES: dict[tuple, Quality] = {}
#: key -> the unedited quality after an edit position (:func:`evaluate_edit`), oldest first.
_UNEDITED: dict[tuple, Quality] = {}


def _model_key(src: ModelSource, seed: int) -> tuple:
    """What a model's results depend on: its name and config, its weight files with their
    size and modification time (a file rewritten in place is another model), the seed."""
    return (src.name, src.config.model_dump_json(), weights_key(src.weight_spec(seed)), seed)


def reference_rows(src: ModelSource, tokens: Sequence[int], *, seed: int = 0) -> ReferenceRows:
    """The float reference's teacher-forced logits of ``tokens`` (float weights), as
    :class:`ReferenceRows`: one forward pass keeps the final hidden states, and each block
    of logits rows is computed when asked for.

    The last few are kept in memory, keyed on the model (:func:`_model_key`) and the token
    ids: the same text compared with several KV formats, read paths or bit configs runs
    the float model once."""
    ids = np.asarray([int(t) for t in tokens], dtype=np.int64)
    key = (_model_key(src, seed), ids.tobytes())
    for k, rows in _REFERENCES:
        if k == key:
            return rows
    # the float weights the compiled model was made from (models.compiler.calibrate_wide.
    # float_weights): held once for both
    ref = ReferenceModel(src.config, float_weights(src.config, src.weight_spec(seed)))
    hidden = ref.final_hidden(ref.embed(ids.tolist()), keep_cache=False)
    rows = ReferenceRows(src.config, hidden, ref._w(src.config.lm_head_tensor))
    _REFERENCES[:] = [*_REFERENCES[-(REFERENCES_KEPT - 1):], (key, rows)]
    return rows


def reference_logits(src: ModelSource, tokens: Sequence[int], *, seed: int = 0) -> np.ndarray:
    """The float reference's teacher-forced logits ``(n, vocab)`` (float weights): every
    row of :func:`reference_rows` at once (``n x vocab`` float64; a long text is better
    read a block at a time). The array returned is read-only."""
    rows = reference_rows(src, tokens, seed=seed)
    return rows.rows(0, rows.n)


#: What a teacher-forced run passes each block of logits to: ``(first position, logits
#: (rows, vocab))``.
OnRows = Callable[[int, np.ndarray], None]


def stream_npu_logits(ready: ReadyModel, tokens: Sequence[int], on_rows: OnRows) -> float:
    """Teacher-force ``tokens`` through the simulated NPU in calls of
    ``ready.compiled.max_seq`` tokens, passing each call's logits ``(tokens, vocab)`` to
    ``on_rows`` as it returns (they are not kept); returns the simulated seconds of the
    prefill calls (the host embeds the tokens: :meth:`ReadyModel.embed`)."""
    time_s, _ = _teacher_force(ready, tokens, on_rows, at=0, apply=None)
    return time_s


def npu_logits(ready: ReadyModel, tokens: Sequence[int]) -> tuple[np.ndarray, float]:
    """The simulated NPU's teacher-forced logits ``(n, vocab)`` and the simulated seconds
    of the prefill calls (:func:`stream_npu_logits`, every block kept)."""
    blocks: list[np.ndarray] = []
    time_s = stream_npu_logits(ready, tokens, lambda _t0, rows: blocks.append(rows))
    return np.concatenate(blocks), time_s


def _teacher_force(ready: ReadyModel, tokens: Sequence[int], on_rows: OnRows, *, at: int,
                   apply: Callable[[Model, int], EditResult] | None
                   ) -> tuple[float, EditResult | None]:
    """Teacher-force ``tokens`` in calls of ``ready.compiled.max_seq`` tokens, with
    ``apply(model, at)`` run on the cache after the first ``at`` tokens (None: no edit),
    the later tokens placed after the edit's new cache size; each call's logits go to
    ``on_rows(first position, logits)``. Returns the simulated seconds of the prefill
    calls and the edit's result."""
    model = ready.launch(ModelConfig(all_logits=True))
    acc, cm = model.acc, ready.compiled
    ids = np.asarray(tokens, dtype=np.int64)
    time_s, res, base = 0.0, None, 0
    try:
        for lo, hi in ((0, at), (at, ids.size)):
            if lo == at and apply is not None:
                res = apply(model, at)
                base = res.new_cache_size - at
            for t0 in range(lo, hi, cm.max_seq):
                chunk = ids[t0 : min(t0 + cm.max_seq, hi)]
                [out] = model.infer(ready.embed(chunk), cache_size=base + t0, all_logits=True)
                time_s += acc.calls[-1].time_s
                on_rows(t0, out)
    finally:
        model.dispose()
    return time_s, res


def evaluate(source: str | Path | ModelSource, tokens: Sequence[int], *, bits: BitConfig,
             kv: str = "int8", hw: str | HardwareConfig = "aries", seed: int = 0,
             reference: np.ndarray | None = None, allow_degenerate: bool = False,
             chunk_tokens: int = CHUNK_TOKENS) -> Quality:
    """Teacher-force ``tokens`` through the simulated NPU (``bits``, KV format ``kv``, the
    read path ``bits.kv_read``, on ``hw``) and compare its logits with the float
    reference's (``reference``: those logits, if already computed). Degenerate NPU logits
    raise :class:`models.quality.DegenerateOutput` unless ``allow_degenerate``.

    Results are deterministic, so the last :data:`QUALITIES_KEPT` are kept in memory,
    keyed on every input (model and weight files, tokens, bit config, KV format, hardware,
    seed, call size, ``allow_degenerate``): tests and tables that ask for the same
    configuration simulate it once. Calls given a ``reference`` are not kept."""
    src = source_of(source)
    ids = [int(t) for t in tokens]
    if len(ids) < 2:
        raise ConfigError(f"text: {len(ids)} tokens; teacher forcing needs at least 2")
    vocab = src.config.vocab_size
    if min(ids) < 0 or max(ids) >= vocab:
        raise ConfigError(f"text: token ids must lie in 0..{vocab - 1}")
    check_context(src, len(ids), f"text: {len(ids):,}")
    hwc = hardware_of(hw)
    # Deterministic, so kept: keyed on every input (a given reference is not: its
    # logits would have to be compared too).
    key = (_model_key(src, seed), np.asarray(ids, np.int64).tobytes(), bits.model_dump_json(),
           kv, hwc.model_dump_json(), chunk_tokens, allow_degenerate)
    if reference is None and key in _QUALITIES:
        return copy.deepcopy(_QUALITIES[key])
    ready = ready_for_text(src, bits, kv=kv, hw=hwc, tokens=len(ids), seed=seed,
                           chunk_tokens=chunk_tokens)
    if reference is not None and reference.shape != (len(ids), vocab):
        raise ConfigError(f"reference: logits of shape {reference.shape}, expected "
                          f"({len(ids)}, {vocab})")
    ref = reference_rows(src, ids, seed=seed) if reference is None else GivenRows(reference)
    # each call's logits compared as they arrive (the text's logits are never all held)
    stream = QualityStream(ids)
    time_s = stream_npu_logits(
        ready, ids, lambda t0, rows: stream.add(ref.rows(t0, t0 + rows.shape[0]), rows, t0))
    q = stream.result(allow_degenerate=allow_degenerate, model=src.name,
                      real_weights=src.real, bits=bits_label(bits),
                      numerics=bits.numerics.model_dump(), kv=kv, kv_read=bits.kv_read,
                      hw=hwc.name, prefill_s=time_s)
    if reference is None:
        _QUALITIES[key] = copy.deepcopy(q)
        while len(_QUALITIES) > QUALITIES_KEPT:
            del _QUALITIES[next(iter(_QUALITIES))]
    return q


#: The KV formats of the quality table: (label, format name or spec). The 2-bit per-token
#: format is KIVI-2 with its keys grouped per token instead of per channel (same group,
#: scales and fp16 window of 128 recent tokens), so it isolates the key axis.
TABLE_FORMATS: tuple[tuple[str, str], ...] = (
    ("int8", "int8"),
    ("kivi-4", "kivi-4"),
    ("qserve-kv4", "qserve-kv4"),
    ("kivi-2", "kivi-2"),
    ("2-bit per-token", "b2.token.g32.asym.scale-fp16.zero-fp16.fp-fp16.window128"),
)
READ_PATHS = ("integer", "dequant")


def quality_table(source: str | Path | ModelSource, tokens: Sequence[int], *,
                  bits: str = "W8", numerics: str | None = None,
                  hw: str | HardwareConfig = "aries",
                  formats: Sequence[tuple[str, str]] = TABLE_FORMATS,
                  read_paths: Sequence[str] = READ_PATHS,
                  allow_degenerate: bool = False,
                  progress=None) -> list[tuple[str, Quality]]:
    """Every KV format of ``formats`` through every read path, on one text: ``(label,
    quality)`` rows (the float reference runs once: :func:`reference_logits` keeps it).
    ``progress(label, read)`` is called
    before each configuration."""
    src = source_of(source)
    rows = []
    for label, fmt in formats:
        for read in read_paths:
            if progress is not None:
                progress(label, read)
            q = evaluate(src, tokens, bits=bit_config(bits, numerics=numerics, kv_read=read),
                         kv=fmt, hw=hw, allow_degenerate=allow_degenerate)
            rows.append((label, q))
    return rows


# --- the quality of a cache edit beside its cost -----------------------------------------

#: The edits :func:`parse_edit` names (``kvsim eval --edit``).
EDIT_HELP = ("requantize:FORMAT (a KV format or K/V layout, e.g. kivi-2; host or device), "
             "evict:SINKS,RECENT,BUDGET (sim.runtime.cacheops.score_eviction; host), "
             "drop:FIRST-LAST (evict those positions; host or device)")
EDIT_SIDES = ("host", "device")


@dataclass(frozen=True)
class CacheEdit:
    """One cache edit, on the host (``host``: a ``sim.runtime.cacheops`` edit function) and, where
    the device has the same op, on the device (``device(model, cache_size)``)."""

    label: str
    host: EditFn
    device: Callable[[Model, int], EditResult] | None = None
    #: raises :class:`CacheOpError` when the device cannot do the edit on a compiled model
    #: (checked before any run)
    device_check: Callable[[CompiledModel], None] | None = None


def requantize_layout(via) -> EditFn:
    """A host edit passing K caches through ``via``'s K format and V caches through its
    V format (a format, a ``KVPair`` or a name ``as_layout`` accepts): the host side of
    ``requantize_on_device(via)``."""
    lay = as_layout(via, "requantize")
    lay = lay if isinstance(lay, kvformats.KVPair) else kvformats.KVPair(lay, lay)
    k_edit, v_edit = requantize_through(lay.k), requantize_through(lay.v)

    def edit(views: list[CacheView]) -> list[np.ndarray]:
        return [(v_edit if v.component == "v" else k_edit)([v])[0] for v in views]

    return edit


def parse_edit(spec: str | EditFn | CacheEdit, *, where: str = "edit") -> CacheEdit:
    """The :class:`CacheEdit` a name gives (:data:`EDIT_HELP`); a callable is a user's
    host edit (e.g. ``sim.runtime.cacheops.round_trip(quantize, pack, unpack, dequantize)``),
    host only. A bad name raises :class:`ConfigError` naming ``where``."""
    if isinstance(spec, CacheEdit):
        return spec
    if callable(spec):
        return CacheEdit(getattr(spec, "__name__", "custom"), spec)
    if not isinstance(spec, str) or ":" not in spec:
        raise ConfigError(f"{where}: {spec!r} is not an edit; one of {EDIT_HELP}")
    kind, arg = (x.strip() for x in spec.split(":", 1))
    try:
        if kind == "requantize":
            via = as_layout(arg, f"{where} requantize")
            # the program of an empty cache checks that the scratch area holds a region
            # in the via formats (the cache's size does not change that)
            return CacheEdit(spec, requantize_layout(via),
                             lambda m, n: m.requantize_on_device(via, cache_size=n),
                             lambda cm: requantize_program(cm, slot=0, tokens=0, via=via))
        if kind == "evict":
            parts = arg.split(",")
            if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
                raise ConfigError(f"{where}: evict takes SINKS,RECENT,BUDGET (three integers "
                                  f">= 0), got {arg!r}")
            sinks, recent, budget = (int(p) for p in parts)
            return CacheEdit(spec, score_eviction(sinks, recent, budget))
        if kind == "drop":
            lo, sep, hi = arg.partition("-")
            if not (sep and lo.strip().isdigit() and hi.strip().isdigit()
                    and int(lo) <= int(hi)):
                raise ConfigError(f"{where}: drop takes FIRST-LAST (integers, FIRST <= LAST), "
                                  f"got {arg!r}")
            drop = list(range(int(lo), int(hi) + 1))
            return CacheEdit(spec, evict_positions(drop),
                             lambda m, n: m.evict_on_device(drop, cache_size=n))
    except CacheOpError as err:
        raise ConfigError(str(err)) from None
    raise ConfigError(f"{where}: unknown edit {kind!r}; one of {EDIT_HELP}")


@dataclass(frozen=True)
class EditQuality:
    """A cache edit's quality effect beside its cost: the text's first ``at`` tokens
    teacher-forced, the edit applied on ``side``, the rest teacher-forced; ``quality``
    and ``unedited`` cover the same predictions (positions ``at ..``), with and without
    the edit, against the float reference."""

    edit: str
    side: str  # "host" | "device"
    at: int
    quality: Quality
    unedited: Quality
    time_s: float  # simulated time of the edit
    pcie_bytes: int  # host link bytes of the edit, both ways
    dram_bytes: int
    host_model_s: float  # the host cost model's share (host edits)
    new_cache_size: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def edited_logits(ready: ReadyModel, tokens: Sequence[int], *, at: int,
                  apply: Callable[[Model, int], EditResult] | None
                  ) -> tuple[np.ndarray, float, EditResult | None]:
    """Teacher-forced logits ``(n, vocab)`` of ``tokens`` with ``apply(model, at)`` run on
    the cache after the first ``at`` tokens (None: no edit; the logits equal
    :func:`npu_logits`'s), the later tokens placed after the edit's new cache size; and
    the simulated seconds of the prefill calls."""
    blocks: list[np.ndarray] = []
    time_s, res = _teacher_force(ready, tokens, lambda _t0, rows: blocks.append(rows),
                                 at=at, apply=apply)
    return np.concatenate(blocks), time_s, res


def edited_quality(ready: ReadyModel, tokens: Sequence[int],
                   ref: ReferenceRows | GivenRows, *, at: int,
                   apply: Callable[[Model, int], EditResult] | None,
                   allow_degenerate: bool = False, **config: Any
                   ) -> tuple[Quality, EditResult | None]:
    """:func:`edited_logits` compared with the float reference's rows as they arrive
    (predictions ``at ..``; ``config``: the :class:`Quality`'s other fields)."""
    stream = QualityStream(tokens, first=at)

    def on_rows(t0: int, rows: np.ndarray) -> None:
        if t0 + rows.shape[0] > at:
            lo = max(t0, at)
            stream.add(ref.rows(lo, t0 + rows.shape[0]), rows[lo - t0:], lo)

    time_s, res = _teacher_force(ready, tokens, on_rows, at=at, apply=apply)
    return stream.result(allow_degenerate=allow_degenerate, prefill_s=time_s, **config), res


def evaluate_edit(source: str | Path | ModelSource, tokens: Sequence[int], *,
                  bits: BitConfig, edit: str | EditFn | CacheEdit, at: int,
                  kv: str = "int8", side: str = "host", hw: str | HardwareConfig = "aries",
                  seed: int = 0, allow_degenerate: bool = False,
                  chunk_tokens: int = CHUNK_TOKENS) -> EditQuality:
    """Teacher-force the first ``at`` tokens of ``tokens``, apply ``edit``
    (:func:`parse_edit`) to the cache on ``side`` (``host``: dump over PCIe, edit, load
    back, timed by the runtime; ``device``: the device's op, where one exists), teacher-
    force the rest, and compare the predictions after the edit with the float reference,
    beside the same predictions without the edit and the edit's simulated cost."""
    src = source_of(source)
    ids = [int(t) for t in tokens]
    ce = parse_edit(edit)
    if side not in EDIT_SIDES:
        raise ConfigError(f"side: {side!r} is not one of {', '.join(EDIT_SIDES)}")
    if side == "device" and ce.device is None:
        raise ConfigError(f"side: the edit {ce.label!r} has no device op (host only)")
    if isinstance(at, bool) or not isinstance(at, int | np.integer) or not (
            1 <= at <= len(ids) - 2):
        raise ConfigError(f"at: {at!r} must be an integer in 1..{len(ids) - 2} (the text "
                          f"has {len(ids)} tokens; predictions must follow the edit)")
    at = int(at)
    check_context(src, len(ids), f"text: {len(ids):,}")
    hwc = hardware_of(hw)
    ready = ready_for_text(src, bits, kv=kv, hw=hwc, tokens=len(ids), seed=seed,
                           chunk_tokens=chunk_tokens)
    if side == "device" and ce.device_check is not None:
        ce.device_check(ready.compiled)
    ref = reference_rows(src, ids, seed=seed)
    config = dict(model=src.name, real_weights=src.real, bits=bits_label(bits),
                  numerics=bits.numerics.model_dump(), kv=kv, kv_read=bits.kv_read,
                  hw=hwc.name, allow_degenerate=allow_degenerate)
    apply = ((lambda m, n: m.edit_cache_on_host(ce.host, cache_size=n)) if side == "host"
             else ce.device)
    # the edited run first: an edit the device cannot do fails before the unedited run
    q, res = edited_quality(ready, ids, ref, at=at, apply=apply, **config)
    # the same predictions without the edit: deterministic, so kept per configuration
    # (host and device edits, and several edits, of one text share it)
    key = (_model_key(src, seed), np.asarray(ids, np.int64).tobytes(), bits.model_dump_json(),
           kv, hwc.model_dump_json(), chunk_tokens, allow_degenerate, at)
    if key not in _UNEDITED:
        _UNEDITED[key], _ = edited_quality(ready, ids, ref, at=at, apply=None, **config)
        while len(_UNEDITED) > QUALITIES_KEPT:
            del _UNEDITED[next(iter(_UNEDITED))]
    return EditQuality(ce.label, side, at, q, copy.deepcopy(_UNEDITED[key]), res.time_s,
                       res.pcie_bytes, res.dram_bytes, res.host_model_s, res.new_cache_size)


__all__ = ["CHUNK_TOKENS", "EDIT_HELP", "EDIT_SIDES", "QUALITIES_KEPT", "READ_PATHS",
           "REFERENCES_KEPT", "TABLE_FORMATS", "CacheEdit", "EditQuality", "bit_config",
           "GivenRows", "ReferenceRows", "bits_label", "check_context", "edited_logits",
           "edited_quality", "evaluate", "evaluate_edit", "npu_logits", "parse_edit",
           "quality_table", "ready_for_text", "reference_logits", "reference_rows",
           "requantize_layout", "stream_npu_logits"]
