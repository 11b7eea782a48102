"""The errors of kvsim's ``qbruntime``: the vendor's one runtime error class, and the error
for what kvsim does not simulate.

The vendor's runtime raises ``qbruntime.QbRuntimeError`` for every failure of its native
library (a bad ``.mxq``, a device-memory ``BadAlloc``, an invalid variant index, a cache
overflow), with a code name in the message, and ``ValueError`` for inputs or outputs of the
wrong shape or dtype. kvsim's raises the same two kinds: :class:`QbRuntimeError` (a
:class:`kvsim.errors.KvsimError`) and :class:`sim.runtime.RuntimeApiError` (a ``ValueError``
too). What the simulated card cannot do raises :class:`NotSimulatedError`, a
``QbRuntimeError``, so host code that handles runtime failures handles it as one, never a
silent no-op.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kvsim.errors import ConfigError, DeviceError, KvsimError


class QbRuntimeError(KvsimError, RuntimeError):
    """A runtime failure (the vendor's ``QbRuntimeError``). ``code`` is the vendor's code
    name where one is documented (``Model_InvalidVariantIdx``, ``Future_NotValid``,
    ``BadAlloc``, ...), else kvsim's own."""

    def __init__(self, message: str, code: str = "Runtime"):
        super().__init__(f"{code}: {message}")
        self.code = code


class NotSimulatedError(QbRuntimeError):
    """A call the vendor's runtime has and kvsim's simulated card does not simulate. The
    message names the call and says why (the table in ``sim.runtime.vendor``)."""

    def __init__(self, call: str, why: str):
        super().__init__(f"{call} is not simulated by kvsim: {why}", code="NotSimulated")
        self.call = call


@contextmanager
def runtime_errors(call: str) -> Iterator[None]:
    """Re-raise kvsim's errors from the runtime underneath as the vendor's: argument and
    shape errors stay ``ValueError``s (:class:`sim.runtime.RuntimeApiError`); a compile or
    model-file problem, a device refusal (DRAM capacity: the vendor's ``BadAlloc``) and a
    cache-operation error become :class:`QbRuntimeError`."""
    from sim.runtime.cacheops import CacheOpError
    from sim.runtime.errors import RuntimeApiError

    try:
        yield
    except (QbRuntimeError, RuntimeApiError):
        raise
    except DeviceError as err:
        code = "BadAlloc" if "capacity" in str(err) or "fit" in str(err) else "Device"
        raise QbRuntimeError(f"{call}: {err}", code) from err
    except CacheOpError as err:
        raise QbRuntimeError(f"{call}: {err}", "Model_Cache") from err
    except (ConfigError, KvsimError) as err:
        raise QbRuntimeError(f"{call}: {err}", "Model_Invalid") from err


__all__ = ["NotSimulatedError", "QbRuntimeError", "runtime_errors"]
