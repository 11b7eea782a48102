"""``ModelVariantHandle``: one variant of a model (its input and output shapes, buffer
information, scales). A kvsim compiled model has one variant, index 0, whose answers are
the model's."""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.runtime.vendor.calltrace import traced_class
from sim.runtime.vendor.enums import DataType
from sim.runtime.vendor.errors import NotSimulatedError
from sim.runtime.vendor.npu_data import NPUData
from sim.runtime.vendor.structs import Buffer, BufferInfo, Scale

_BUFFERS = ("the buffer API hands the NPU's internal data layout to the host; kvsim models "
            "no host-side repositioning of NPU buffers")


@traced_class()
class ModelVariantHandle:
    """Variant 0 of a model (``Model.get_model_variant_handle(0)``)."""

    def __init__(self, _model_variant_handle: Any):
        self._model_variant_handle = _model_variant_handle  # the Model
        self._output_shape = self.get_model_output_shape()

    @classmethod
    def from_cpp(cls, _model_variant_handle: Any) -> ModelVariantHandle:
        return cls(_model_variant_handle)

    def get_variant_idx(self) -> int:
        return 0

    def get_model_input_shape(self) -> list[tuple[int, ...]]:
        return self._model_variant_handle.get_model_input_shape()

    def get_model_output_shape(self) -> list[tuple[int, ...]]:
        return self._model_variant_handle.get_model_output_shape()

    def get_input_buffer_info(self) -> list[BufferInfo]:
        return self._model_variant_handle.get_input_buffer_info()

    def get_output_buffer_info(self) -> list[BufferInfo]:
        return self._model_variant_handle.get_output_buffer_info()

    def get_input_scale(self) -> list[Scale]:
        return self._model_variant_handle.get_input_scale()

    def get_output_scale(self) -> list[Scale]:
        return self._model_variant_handle.get_output_scale()

    def get_model_input_data_type(self) -> DataType:
        return self._model_variant_handle.get_model_input_data_type()

    def get_model_output_data_type(self) -> DataType:
        return self._model_variant_handle.get_model_output_data_type()

    def acquire_input_buffer(self, seqlens: list[list[int]] = ()) -> list[Buffer]:
        raise NotSimulatedError("ModelVariantHandle.acquire_input_buffer", _BUFFERS)

    def acquire_output_buffer(self, seqlens: list[list[int]] = ()) -> list[Buffer]:
        raise NotSimulatedError("ModelVariantHandle.acquire_output_buffer", _BUFFERS)

    def acquire_input_npu_data(self, shape: list[int], idx: int, upload: bool,
                               dtype: DataType) -> NPUData:
        raise NotSimulatedError("ModelVariantHandle.acquire_input_npu_data",
                                "tensors kept on the NPU between calls")

    def acquire_output_npu_data(self, shape: list[int], idx: int, upload: bool,
                                dtype: DataType) -> NPUData:
        raise NotSimulatedError("ModelVariantHandle.acquire_output_npu_data",
                                "tensors kept on the NPU between calls")

    def release_buffer(self, buffer: list[Buffer]) -> None:
        raise NotSimulatedError("ModelVariantHandle.release_buffer", _BUFFERS)

    def reposition_inputs(self, inputs: list[np.ndarray], input_bufs: list[Buffer],
                          seqlens: list[list[int]] = ()) -> None:
        raise NotSimulatedError("ModelVariantHandle.reposition_inputs", _BUFFERS)

    def reposition_outputs(self, output_bufs: list[Buffer], outputs: list[np.ndarray],
                           seqlens: list[list[int]] = ()) -> None:
        raise NotSimulatedError("ModelVariantHandle.reposition_outputs", _BUFFERS)


__all__ = ["ModelVariantHandle"]
