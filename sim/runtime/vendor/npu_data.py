"""``NPUData``: a model input or output tensor on the host or on the NPU (beta in the
vendor runtime 1.5.0). kvsim does not simulate device-resident tensors
(``Model.acquire_*_npu_data`` and ``infer_npu_data`` raise ``NotSimulatedError``); this is
the class's surface over a host array, which is where a kvsim NPUData always is."""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.runtime.vendor.accelerator import Accelerator
from sim.runtime.vendor.calltrace import traced_class
from sim.runtime.vendor.errors import NotSimulatedError


@traced_class()
class NPUData:
    """A tensor that lives on the host (``dev_no`` -1) in kvsim."""

    def __init__(self, _npu_data: Any):
        self._npu_data = _npu_data
        self._array = np.asarray(_npu_data)

    def launch(self, acc: Accelerator) -> None:
        raise NotSimulatedError("NPUData.launch", "tensors kept on the NPU between calls")

    def cpu(self) -> None:
        """The data is on the host already."""

    def copy_from(self, src: NPUData) -> None:
        if src.shape != self.shape or src.dtype != self.dtype:
            raise ValueError(f"NPUData.copy_from: {src.shape} {src.dtype} into {self.shape} "
                             f"{self.dtype}")
        self._array[...] = src._array

    def __getitem__(self, key: Any) -> Any:
        return self._array[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._array[key] = value

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._array.shape)

    @property
    def dtype(self) -> np.dtype:
        return self._array.dtype

    @property
    def dev_no(self) -> int:
        """-1: on the host."""
        return -1

    @property
    def hardware_name(self) -> str:
        """Empty: on the host."""
        return ""


__all__ = ["NPUData"]
