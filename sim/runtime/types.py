"""The small value types of the runtime API: model options, batch parameters, cache and
buffer descriptions, and the record of what one call cost."""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.runtime.errors import RuntimeApiError, is_index

#: Core modes a compiled model can have (FACTS.md: qb runtime ``ModelConfig``).
CORE_MODES = ("single", "global4", "global8")


@dataclass
class ModelConfig:
    """Runtime model options (the vendor's ``ModelConfig``). The core mode, set here or
    by the vendor's setters, must match the compiled model's (``None``: take the
    model's). kvsim simulates one model instance per ``Model``, so single-core mode
    takes one core.

    ``all_logits`` (kvsim's own option, not the vendor's): reserve at launch the device
    regions that ``infer(..., all_logits=True)`` needs (every position's logits of a call
    of up to the compiled ``max_seq`` tokens: ``max_seq x vocab`` int32 logits in DRAM)."""

    core_mode: str | None = None
    all_logits: bool = False

    def __post_init__(self) -> None:
        if self.core_mode not in (None, *CORE_MODES):
            raise RuntimeApiError(f"ModelConfig.core_mode {self.core_mode!r}: valid modes are "
                                  f"{', '.join(CORE_MODES)} (or None: the compiled model's)")
        if not isinstance(self.all_logits, bool):
            raise RuntimeApiError(f"ModelConfig.all_logits must be True or False, got "
                                  f"{self.all_logits!r}")

    def set_single_core_mode(self, num_cores: int | None = None) -> bool:
        """Each core runs its own model instance; kvsim runs one (``num_cores`` 1)."""
        if num_cores is not None and (not is_index(num_cores) or num_cores != 1):
            raise RuntimeApiError(f"set_single_core_mode({num_cores!r}): kvsim simulates one "
                                  f"model instance per Model; use 1 (or no argument)")
        self.core_mode = "single"
        return True

    def set_global4_core_mode(self) -> bool:
        """The 4 cores of a cluster run one inference together."""
        self.core_mode = "global4"
        return True

    def set_global8_core_mode(self) -> bool:
        """All 8 cores run one inference together."""
        self.core_mode = "global8"
        return True

    def get_core_mode(self) -> str | None:
        return self.core_mode


@dataclass(frozen=True)
class BatchParam:
    """One request of a batched ``infer``: its tokens, its cache size, its cache slot."""

    sequence_length: int
    cache_size: int
    cache_id: int = 0


@dataclass(frozen=True)
class CacheInfo:
    """One KV cache of the launched model (the vendor's ``CacheInfo``)."""

    cache_type: str  # "key", "value" (GQA) or "latent" (MLA)
    name: str
    layer_hash: str
    size: int  # bytes of one slot's cache region
    num_batches: int  # cache slots


@dataclass(frozen=True)
class BufferInfo:
    """The input buffer of the launched model (the vendor's ``get_input_buffer_info()``
    entry). The embeddings of one call are read as an image of height 1, width = tokens,
    channels = hidden size (kvsim's reading of the vendor's (1, seq, hidden) input)."""

    max_height: int  # 1
    max_width: int  # most tokens of one call (max_sequence_length)
    max_channel: int  # hidden size
    max_cache_size: int  # KV-cache capacity in tokens (max_cache_length)


@dataclass
class CallRecord:
    """What one runtime call cost (for metrics and reports)."""

    op: str
    start_ps: int
    end_ps: int
    stats: dict = field(default_factory=dict)

    @property
    def time_s(self) -> float:
        return (self.end_ps - self.start_ps) / 1e12


__all__ = ["CORE_MODES", "BatchParam", "BufferInfo", "CacheInfo", "CallRecord", "ModelConfig"]
