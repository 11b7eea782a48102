import os
import time
from pathlib import Path

import pytest
import simpy
from hypothesis import HealthCheck, settings

from traces.recorder import Recorder

# Hypothesis profiles, chosen with HYPOTHESIS_PROFILE (default "ci"):
#   ci   - Hypothesis's default of 100 examples per property: the fuzz tests
#          (tests/test_fuzz.py) run briefly in every test run and in CI.
#   fuzz - long fuzzing: HYPOTHESIS_PROFILE=fuzz python -m pytest tests/test_fuzz.py
#          (50,000 examples per property, or HYPOTHESIS_EXAMPLES; no deadline; failures
#          are saved in .hypothesis/ and replayed first on the next run).
# CI runs a fixed set of examples (derandomize): a red CI names a change, not luck;
# the fuzz profile explores at random. Neither has a deadline: a shared, loaded machine
# must not turn a slow example into a failure (tests never assert wall-clock times).
settings.register_profile("ci", max_examples=100, derandomize=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("fuzz", max_examples=int(os.environ.get("HYPOTHESIS_EXAMPLES",
                                                                 50_000)), deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    """Under ``-n N`` without an explicit ``--dist``, distribute with ``loadgroup``: the
    real-model tests' groups (:mod:`tests.groups`) each run in one worker, handed out
    first. xdist's default, ``load``, ignores the groups and may split a module's
    real-model tests over both workers, each compiling and calibrating the same model.

    The controller's choice must reach the workers too: a worker parses the command line
    afresh (so it would see xdist's default) and names each grouped test after its group
    only if it was told ``loadgroup``; :func:`pytest_configure_node` passes the choice in
    the worker's input and the worker takes it here."""
    if hasattr(config, "workerinput"):  # a worker: the controller's choice
        if config.workerinput.get(_LOADGROUP):
            config.option.loadgroup = True
        return
    explicit = any(a == "--dist" or a.startswith("--dist=") or a == "-d"
                   for a in config.invocation_params.args)
    if getattr(config.option, "dist", "no") == "load" and not explicit:
        config.option.dist = "loadgroup"


#: The key of the worker input that says the controller distributes with ``loadgroup``.
_LOADGROUP = "kvsim_loadgroup"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """(xdist, in the controller) Tells each worker whether the groups apply."""
    node.workerinput[_LOADGROUP] = node.config.getvalue("dist") == "loadgroup"


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Under ``-n N`` (N >= 2), the controller compiles the Numba kernels of the heavy
    tests once, in a few processes side by side, before the workers start
    (:mod:`tests.jit_warmup`: otherwise both workers compile the same kernels on a fresh
    checkout). Runs first, before xdist's own session start launches the workers."""
    config = session.config
    workers = getattr(config.option, "numprocesses", None)
    if hasattr(config, "workerinput") or not isinstance(workers, int) or workers < 2:
        return
    from tests.jit_warmup import PARTS, run_parts

    t0 = time.perf_counter()
    problems = run_parts(config.rootpath)
    say = config.pluginmanager.get_plugin("terminalreporter")
    line = (f"Numba kernels compiled or loaded in {len(PARTS)} processes: "
            f"{time.perf_counter() - t0:.1f} s")
    for problem in problems:  # the tests that use them compile what they need themselves
        line += f"\nwarm-up {problem}"
    if say is not None:
        say.write_line(line)


@pytest.fixture
def env():
    return simpy.Environment()


@pytest.fixture
def log():
    return []


@pytest.fixture
def recorder():
    return Recorder(level="tiles")


@pytest.fixture(scope="session")
def embedded_default_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The output folder of ``kvsim run`` on the embedded default config, run once per
    process (the full run and its outputs take a minute): ``tests/sim/test_cli.py`` and
    ``tests/test_examples.py`` read it (the embedded default is ``configs/quickstart.toml``:
    ``test_quickstart_is_the_embedded_default``); readers must not change it."""
    from sim.app.cli.main import main

    out = tmp_path_factory.mktemp("embedded-default") / "out"
    assert main(["run", "--out", str(out), "-q"]) == 0
    return out
