"""``ModelConfig``: the core mode and the cores or clusters a model runs on (the vendor
runtime's ``type.ModelConfig``).

A default ``ModelConfig()`` is in auto-core mode: the model takes the core mode it was
compiled for. The setters record the mode and the targets; the model checks them against
its compiled core mode when it is created (:class:`sim.runtime.vendor.model.Model`). A
setter returns True when it set the mode and False for targets that name no core of an
ARIES card (the vendor's documented return), leaving the config unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sim.runtime.errors import RuntimeApiError, is_index
from sim.runtime.vendor.calltrace import traced_class
from sim.runtime.vendor.enums import (
    CLUSTERS,
    LOCAL_CORES,
    Cluster,
    CoreAllocationPolicy,
    CoreMode,
)
from sim.runtime.vendor.structs import CoreId

#: local cores per cluster and clusters of an ARIES card (FACTS.md: 2 clusters x 4 cores)
CORES_PER_CLUSTER = len(LOCAL_CORES)
NUM_CORES = len(CLUSTERS) * CORES_PER_CLUSTER


def _clusters(clusters: Any, where: str) -> list[Cluster] | None:
    """``clusters`` as a list, or None if one of them is no cluster of the card."""
    if not isinstance(clusters, list | tuple):
        raise RuntimeApiError(f"{where}: clusters must be a list of Cluster, got "
                              f"{type(clusters).__name__}")
    out = list(clusters)
    if not out or any(c not in CLUSTERS for c in out) or len(set(out)) != len(out):
        return None
    return out


@traced_class()
class ModelConfig:
    """Core mode and core allocation of a model (default: auto-core mode)."""

    def __init__(self, num_cores: int | None = None):
        self.set_auto_core_mode()
        self._forced_bundle = -1
        self._async = False
        if num_cores is not None:
            if not self.set_single_core_mode(num_cores):
                raise RuntimeApiError(f"ModelConfig({num_cores!r}): num_cores must be 1.."
                                      f"{NUM_CORES}")

    def _set(self, mode: CoreMode, policy: CoreAllocationPolicy, *, core_ids=(), clusters=(),
             num_cores: int | None = None) -> bool:
        self._mode, self._policy = mode, policy
        self._core_ids, self._clusters_ = list(core_ids), list(clusters)
        self._num_cores = num_cores
        return True

    def set_auto_core_mode(self) -> bool:
        """The model takes its compiled core mode on every core it needs; the activation
        slot count goes back to -1 (not set)."""
        self._slots = -1
        return self._set(CoreMode.Auto, CoreAllocationPolicy.Auto)

    def set_single_core_mode(self, num_cores: int | None = None,
                             core_ids: list[CoreId] | None = None) -> bool:
        """Each local core runs its own instance: ``num_cores`` cores chosen at launch, or
        exactly the cores of ``core_ids`` (also accepted as the first argument)."""
        if isinstance(num_cores, list | tuple) and core_ids is None:
            num_cores, core_ids = None, num_cores
        if (num_cores is None) == (core_ids is None):
            raise RuntimeApiError("ModelConfig.set_single_core_mode needs either num_cores "
                                  "or core_ids")
        if num_cores is not None:
            if not is_index(num_cores):
                raise RuntimeApiError(f"set_single_core_mode: num_cores must be an integer, "
                                      f"got {num_cores!r}")
            if not 1 <= num_cores <= NUM_CORES:
                return False
            return self._set(CoreMode.Single, CoreAllocationPolicy.Auto,
                             num_cores=int(num_cores))
        ids = list(core_ids)  # type: ignore[arg-type]
        if not all(isinstance(c, CoreId) for c in ids):
            raise RuntimeApiError("set_single_core_mode: core_ids must be a list of CoreId")
        keys = [(c.cluster, c.core) for c in ids]
        if (not ids or len(set(keys)) != len(keys)
                or any(c.cluster not in CLUSTERS or c.core not in LOCAL_CORES for c in ids)):
            return False
        return self._set(CoreMode.Single, CoreAllocationPolicy.Manual, core_ids=ids)

    def set_global_core_mode(self, clusters: list[Cluster]) -> bool:
        """Deprecated name of global4-core mode on ``clusters``."""
        cl = _clusters(clusters, "set_global_core_mode")
        return cl is not None and self._set(CoreMode.Global, CoreAllocationPolicy.Manual,
                                            clusters=cl)

    def set_global4_core_mode(self, clusters: Sequence[Cluster] = CLUSTERS) -> bool:
        """The four local cores of a cluster run one inference together, on each of
        ``clusters``."""
        cl = _clusters(clusters, "set_global4_core_mode")
        return cl is not None and self._set(CoreMode.Global4, CoreAllocationPolicy.Manual,
                                            clusters=cl)

    def set_global8_core_mode(self) -> bool:
        """All eight local cores of both clusters run one inference together."""
        return self._set(CoreMode.Global8, CoreAllocationPolicy.Auto)

    def get_core_mode(self) -> CoreMode:
        return self._mode

    def set_multi_core_mode(self, clusters: Sequence[Cluster] = CLUSTERS) -> bool:
        """The four cores of a cluster process a batch together (batch inference)."""
        cl = _clusters(clusters, "set_multi_core_mode")
        return cl is not None and self._set(CoreMode.Multi, CoreAllocationPolicy.Manual,
                                            clusters=cl)

    def get_core_allocation_policy(self) -> CoreAllocationPolicy:
        """``Manual`` when the cores or clusters were listed, ``Auto`` otherwise."""
        return self._policy

    def get_num_cores(self) -> int:
        """Cores the model will take (ARIES: 8 in auto and global8 mode, 4 per cluster in
        global4 and multi mode, one per instance in single-core mode)."""
        if self._mode is CoreMode.Single:
            return self._num_cores if self._num_cores is not None else len(self._core_ids)
        if self._mode in (CoreMode.Multi, CoreMode.Global, CoreMode.Global4):
            return CORES_PER_CLUSTER * len(self._clusters_)
        return NUM_CORES

    def force_single_npu_bundle(self, npu_bundle_index: int) -> bool:
        """Run only NPU bundle ``npu_bundle_index`` (no CPU offload), or every bundle with
        -1. False for an index below -1."""
        if not is_index(npu_bundle_index):
            raise RuntimeApiError(f"force_single_npu_bundle: npu_bundle_index must be an "
                                  f"integer, got {npu_bundle_index!r}")
        if npu_bundle_index < -1:
            return False
        self._forced_bundle = int(npu_bundle_index)
        return True

    def get_forced_npu_bundle_index(self) -> int:
        return self._forced_bundle

    def set_async_pipeline_enabled(self, enable: bool) -> None:
        self._async = bool(enable)

    def get_async_pipeline_enabled(self) -> bool:
        return self._async

    def set_activation_slots(self, num: int) -> None:
        """Activation buffer slots (an LLM's is fixed to 1 whatever is set here, as the
        vendor documents)."""
        if not is_index(num) or num < 1:
            raise RuntimeApiError(f"set_activation_slots: num must be an integer >= 1, got "
                                  f"{num!r}")
        self._slots = int(num)

    def get_activation_slots(self) -> int:
        return self._slots

    def get_core_ids(self) -> list[CoreId]:
        return [CoreId(c.cluster, c.core) for c in self._core_ids]

    def get_clusters(self) -> list[Cluster]:
        return list(self._clusters_)

    def __repr__(self) -> str:
        return (f"ModelConfig(core_mode={self._mode}, core_allocation_policy={self._policy}, "
                f"core_ids={self.get_core_ids()}, clusters={self._clusters_}, "
                f"num_cores={self.get_num_cores()}, "
                f"forced_npu_bundle_index={self._forced_bundle})")


__all__ = ["CORES_PER_CLUSTER", "NUM_CORES", "ModelConfig"]
