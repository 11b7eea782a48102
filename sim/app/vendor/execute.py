"""``kvsim exec -- COMMAND ...``: run a program with kvsim's ``qbruntime`` (and ``maccel``)
in place of the vendor's, on simulated cards.

The child gets the shim folder (:data:`sim.runtime.vendor.SHIM_DIR`) first on its
``PYTHONPATH`` and the simulated system in ``KVSIM_QB_*`` variables
(:mod:`sim.runtime.vendor.system`); nothing else changes, and nothing is installed. If a
real runtime (``mobilint-qb-runtime`` or ``maccel``) is installed in this environment the
child would import kvsim's instead: that is refused unless ``--shadow`` asks for it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from kvsim.errors import ConfigError
from sim.runtime.vendor import SHIM_DIR
from sim.runtime.vendor.clock import MODES
from sim.runtime.vendor.system import (
    ENV_CARDS,
    ENV_CLOCK,
    ENV_FUNCTIONAL,
    ENV_HW,
    ENV_TRACE,
    MAX_CARDS,
)

#: the vendor's runtime packages: (module, distribution)
RUNTIMES = (("qbruntime", "mobilint-qb-runtime"), ("maccel", "maccel"))


def real_runtimes() -> list[str]:
    """The vendor runtimes installed in this environment (``name version at path``)."""
    found = []
    for module, dist in RUNTIMES:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        origin = spec.origin if spec is not None else None
        if origin is not None and Path(origin).resolve().is_relative_to(SHIM_DIR):
            continue  # kvsim's own shim, already on the path
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = None
        if origin is not None or version is not None:
            found.append(f"{dist} {version or '(version unknown)'} "
                         f"at {Path(origin).parent if origin else '?'}")
    return found


def child_env(base: dict[str, str], *, hw: str, cards: int, clock: str,
              functional: bool | None, trace_calls: str | None) -> dict[str, str]:
    """The child's environment: ``base`` with the shim first on ``PYTHONPATH`` and the
    simulated system described."""
    env = dict(base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SHIM_DIR), base.get("PYTHONPATH"))
                                        if p)
    env[ENV_HW], env[ENV_CARDS], env[ENV_CLOCK] = hw, str(cards), clock
    env.pop(ENV_FUNCTIONAL, None)
    env.pop(ENV_TRACE, None)
    if functional is not None:
        env[ENV_FUNCTIONAL] = "1" if functional else "0"
    if trace_calls:
        env[ENV_TRACE] = str(Path(trace_calls).resolve())
    return env


def run(command: Sequence[str], *, hw: str = "aries", cards: int = 1, clock: str = "sim",
        functional: bool | None = None, trace_calls: str | None = None,
        shadow: bool = False) -> int:
    """Run ``command`` on the simulated system; returns its exit code."""
    from sim.device.hw import preset_names

    argv = list(command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise ConfigError("exec: no command given (kvsim exec [options] -- COMMAND ...)")
    if hw not in preset_names():
        raise ConfigError(f"--hw: unknown hardware preset {hw!r}; valid: "
                          f"{', '.join(preset_names())}")
    if not 1 <= cards <= MAX_CARDS:
        raise ConfigError(f"--cards: must be 1..{MAX_CARDS}, got {cards}")
    if clock not in MODES:
        raise ConfigError(f"--clock: {clock!r} is not one of {', '.join(MODES)}")
    if trace_calls is not None:  # written at the program's exit: tested for real now
        from kvsim.files import check_out_file

        check_out_file(Path(trace_calls).resolve(), "--trace-calls")
    real = real_runtimes()
    if real and not shadow:
        raise ConfigError(f"exec: a real runtime is installed here ({'; '.join(real)}); the "
                          f"command would import kvsim's instead. Pass --shadow to run it on "
                          f"the simulated card anyway")
    env = child_env(dict(os.environ), hw=hw, cards=cards, clock=clock, functional=functional,
                    trace_calls=trace_calls)
    try:
        return subprocess.run(argv, env=env, check=False).returncode
    except FileNotFoundError:
        raise ConfigError(f"exec: command not found: {argv[0]}") from None
    except PermissionError:
        raise ConfigError(f"exec: cannot run {argv[0]} (permission denied)") from None


__all__ = ["RUNTIMES", "child_env", "real_runtimes", "run"]
