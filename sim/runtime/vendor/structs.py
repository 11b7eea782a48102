"""The small value types of the vendor runtime's ``type.py``: quantization scales, core
ids, byte buffers, buffer and cache descriptions, batch parameters. Their fields are
properties with setters, as the vendor's are; ``from_cpp`` builds one from any object with
the same fields (the vendor's takes its native struct: kvsim has no native layer)."""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.runtime.errors import RuntimeApiError
from sim.runtime.vendor.calltrace import traced_class
from sim.runtime.vendor.enums import CacheType, Cluster, Core


def _field(name: str, doc: str = "") -> property:
    key = "_" + name

    def get(self: Any) -> Any:
        return getattr(self, key)

    def set_(self: Any, value: Any) -> None:
        setattr(self, key, value)

    return property(get, set_, doc=doc)


def _repr(obj: Any, names: tuple[str, ...]) -> str:
    return f"{type(obj).__name__}({', '.join(f'{n}={getattr(obj, n)}' for n in names)})"


@traced_class()
class Scale:
    """A quantization scale: one value (``is_uniform``) or one per channel
    (``scale_list``), with zero points for asymmetric quantization."""

    def __init__(self, scale: float, is_uniform: bool, scale_list: list[float],
                 zero_point: int = 0, is_asymmetric: bool = False,
                 zero_points: list[int] | None = None):
        self._scale = float(scale)
        self._is_uniform = bool(is_uniform)
        self._scale_list = list(scale_list)
        self._zero_point = int(zero_point)
        self._is_asymmetric = bool(is_asymmetric)
        self._zero_points = list(zero_points) if zero_points is not None else []

    _NAMES = ("scale", "is_uniform", "scale_list", "zero_point", "is_asymmetric",
              "zero_points")

    @classmethod
    def from_cpp(cls, _scale: Any) -> Scale:
        return cls(*(getattr(_scale, n) for n in cls._NAMES))

    scale = _field("scale")
    is_uniform = _field("is_uniform")
    scale_list = _field("scale_list")
    zero_point = _field("zero_point", "uniform zero point (asymmetric quantization)")
    is_asymmetric = _field("is_asymmetric")
    zero_points = _field("zero_points", "per-channel zero points")

    def __getitem__(self, i: int) -> float:
        """The scale of channel ``i`` (the one scale when uniform)."""
        return self._scale if self._is_uniform else self._scale_list[i]

    def __repr__(self) -> str:
        return _repr(self, self._NAMES)


@traced_class()
class CoreId:
    """One NPU core: a cluster and a core within it."""

    def __init__(self, cluster: Cluster, core: Core):
        if not isinstance(cluster, Cluster) or not isinstance(core, Core):
            raise RuntimeApiError(f"CoreId(cluster, core): expected a Cluster and a Core, got "
                                  f"{cluster!r}, {core!r}")
        self._cluster, self._core = cluster, core

    @classmethod
    def from_cpp(cls, _core_id: Any) -> CoreId:
        return cls(Cluster(_core_id.cluster), Core(_core_id.core))

    cluster = _field("cluster")
    core = _field("core")

    def _key(self) -> tuple[int, int]:
        return list(Cluster).index(self._cluster), list(Core).index(self._core)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CoreId) and self._key() == other._key()

    def __lt__(self, other: CoreId) -> bool:
        return self._key() < other._key()

    __hash__ = None  # type: ignore[assignment]  # mutable, as the vendor's

    def __repr__(self) -> str:
        return _repr(self, ("cluster", "core"))


@traced_class()
class Buffer:
    """A contiguous block of bytes (the buffer API's unit). kvsim keeps the bytes on the
    host; the calls that hand buffers to the NPU are not simulated (``Model.infer_buffer``)."""

    def __init__(self, _buffer: Any = None):
        self._data = b"" if _buffer is None else bytes(memoryview(_buffer).cast("B"))
        self._size = len(self._data)

    size = _field("size")

    def set_buffer(self, arr: np.ndarray) -> None:
        self._data = np.ascontiguousarray(arr).tobytes()
        self._size = len(self._data)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self._size})"


_BUFFER_FIELDS = ("original_height", "original_width", "original_channel", "reshaped_height",
                  "reshaped_width", "reshaped_channel", "height", "width", "channel",
                  "max_height", "max_width", "max_channel", "max_cache_size")


@traced_class()
class BufferInfo:
    """An input or output buffer: its original shape, the reshaped one, the NPU's, the
    largest a sequential input may take, and the KV capacity of an LLM (tokens)."""

    def __init__(self, original_height: int = 0, original_width: int = 0,
                 original_channel: int = 0, reshaped_height: int = 0, reshaped_width: int = 0,
                 reshaped_channel: int = 0, height: int = 0, width: int = 0, channel: int = 0,
                 max_height: int = 0, max_width: int = 0, max_channel: int = 0,
                 max_cache_size: int = 0):
        values = (original_height, original_width, original_channel, reshaped_height,
                  reshaped_width, reshaped_channel, height, width, channel, max_height,
                  max_width, max_channel, max_cache_size)
        for name, v in zip(_BUFFER_FIELDS, values, strict=True):
            setattr(self, "_" + name, int(v))

    @classmethod
    def from_cpp(cls, _buffer_info: Any) -> BufferInfo:
        return cls(*(getattr(_buffer_info, n) for n in _BUFFER_FIELDS))

    original_height = _field("original_height")
    original_width = _field("original_width")
    original_channel = _field("original_channel")
    reshaped_height = _field("reshaped_height")
    reshaped_width = _field("reshaped_width")
    reshaped_channel = _field("reshaped_channel")
    height = _field("height")
    width = _field("width")
    channel = _field("channel")
    max_height = _field("max_height")
    max_width = _field("max_width")
    max_channel = _field("max_channel")
    max_cache_size = _field("max_cache_size", "KV-cache capacity in tokens")

    def original_size(self) -> int:
        return self._original_height * self._original_width * self._original_channel

    def reshaped_size(self) -> int:
        return self._reshaped_height * self._reshaped_width * self._reshaped_channel

    def size(self) -> int:
        return self._height * self._width * self._channel

    def original_shape(self) -> tuple[int, int, int]:
        return self._original_height, self._original_width, self._original_channel

    def original_shape_chw(self) -> tuple[int, int, int]:
        return self._original_channel, self._original_height, self._original_width

    def reshaped_shape(self) -> tuple[int, int, int]:
        return self._reshaped_height, self._reshaped_width, self._reshaped_channel

    def reshaped_shape_chw(self) -> tuple[int, int, int]:
        return self._reshaped_channel, self._reshaped_height, self._reshaped_width

    def shape(self) -> tuple[int, int, int]:
        return self._height, self._width, self._channel

    def shape_chw(self) -> tuple[int, int, int]:
        return self._channel, self._height, self._width

    def __repr__(self) -> str:
        return _repr(self, _BUFFER_FIELDS)


@traced_class()
class CacheInfo:
    """One KV cache of a launched model: its kind, name, layer hash, bytes of one slot,
    and its slots (``num_batches``)."""

    def __init__(self, cache_type: CacheType = CacheType.Error, name: str = "",
                 layer_hash: str = "", size: int = 0, num_batches: int = 0):
        self._cache_type, self._name, self._layer_hash = cache_type, name, layer_hash
        self._size, self._num_batches = int(size), int(num_batches)

    @classmethod
    def from_cpp(cls, _cache_info: Any) -> CacheInfo:
        return cls(*(getattr(_cache_info, n) for n in
                     ("cache_type", "name", "layer_hash", "size", "num_batches")))

    cache_type = _field("cache_type")
    name = _field("name")
    layer_hash = _field("layer_hash")
    size = _field("size")
    num_batches = _field("num_batches")

    def __repr__(self) -> str:
        return _repr(self, ("cache_type", "name", "layer_hash", "size", "num_batches"))


@traced_class()
class BatchParam:
    """One request of a batch-LLM ``infer``: its tokens on the sequence axis, its cache
    size, its cache slot."""

    def __init__(self, sequence_length: int = 0, cache_size: int = 0, cache_id: int = 0):
        self._sequence_length, self._cache_size, self._cache_id = (sequence_length,
                                                                   cache_size, cache_id)

    sequence_length = _field("sequence_length")
    cache_size = _field("cache_size")
    cache_id = _field("cache_id")

    def __repr__(self) -> str:
        return _repr(self, ("sequence_length", "cache_size", "cache_id"))


__all__ = ["BatchParam", "Buffer", "BufferInfo", "CacheInfo", "CoreId", "Scale"]
