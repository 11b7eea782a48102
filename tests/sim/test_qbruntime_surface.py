"""The surface test: every public name of mobilint-qb-runtime 1.5.0 (the committed snapshot,
``sim/app/vendor/data/qbruntime-1.5.0.surface.json``) is in kvsim's ``qbruntime`` with a
compatible signature; the reader and the comparison find what they look for; and, where
the vendor's wheel is at hand (``KVSIM_VENDOR_WHEELS``: a folder holding it), the snapshot
is what the wheel says today."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest

from sim.app.vendor import surface as S
from sim.runtime.vendor import SHIM_DIR
from sim.runtime.vendor.model import NOT_SIMULATED


def _compare(snapshot) -> list[str]:
    with S.shim_package(SHIM_DIR, snapshot["package"]) as load:
        return S.compare(snapshot, load)


def test_kvsims_qbruntime_has_the_whole_1_5_0_surface():
    snap = S.load_snapshot()
    assert (snap["distribution"], snap["version"]) == ("mobilint-qb-runtime", "1.5.0")
    names = {m: sorted(v["names"]) for m, v in snap["modules"].items()}
    assert len(names) == 9 and sum(map(len, names.values())) == 110
    assert "infer_async" in snap["objects"]["qbruntime.model.Model"]["members"]
    assert _compare(snap) == []


def test_the_comparison_finds_each_kind_of_difference():
    snap = copy.deepcopy(S.load_snapshot())
    model = snap["objects"]["qbruntime.model.Model"]["members"]
    model["infer"]["params"][2]["default"] = "1"
    model["launch"]["params"].append({"name": "where", "kind": "positional_or_keyword",
                                      "default": None})
    model["warm_up"] = {"kind": "method", "params": []}
    snap["objects"]["qbruntime.type.CoreMode"]["enum_members"].append("Global16")
    snap["modules"]["qbruntime.version"]["names"]["__build__"] = "qbruntime.version.__version__"
    problems = set(_compare(snap))
    assert {"qbruntime.Model.infer: default of 'cache_size' is 0, the vendor's is 1",
            "qbruntime.Model.launch: positional parameter 1 is missing, the vendor's is "
            "'where'", "qbruntime.Model.warm_up: missing",
            "qbruntime.version.__build__: missing"} <= problems
    assert any(p.startswith("qbruntime.CoreMode: enum members") for p in problems)


PACKAGE = {
    "pkg/__init__.py": "from .types import *\nfrom .core import *\n"
                       "from pkg.pkg import PkgError\n__all__ = ['Kind', 'run', 'PkgError']\n",
    "pkg/core.py": "from typing import overload\nimport numpy as np\nfrom .types import Kind\n"
                   "__all__ = ['run', 'Box']\n"
                   "def run(x, n: int = 2, *, kind=Kind.A, **kw): ...\n"
                   "def _hidden(): ...\nclass Box:\n    @overload\n    def __init__(self, a: int)"
                   ": ...\n    def __init__(self, a=0, b=None): ...\n    @property\n    def size"
                   "(self): ...\n    @size.setter\n    def size(self, v): ...\n    @classmethod\n"
                   "    def make(cls, raw): ...\n    def _private(self): ...\n",
    "pkg/types.py": "from enum import Enum\nclass Kind(Enum):\n    A = 1\n    B = 2\n"
                    "__version__: str = '9'\n",
}


def test_the_reader_follows_star_imports_and_reads_signatures(tmp_path):
    for name, text in PACKAGE.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    sources, _ = S.read_sources(tmp_path, "pkg")
    surf = S.extract(sources, package="pkg", distribution="pkg", version="9")
    top = surf["modules"]["pkg"]
    # types has no __all__ (its names without a leading underscore: not __version__),
    # core's __all__ limits it to run and Box
    assert top["names"] == {"Box": "pkg.core.Box", "Kind": "pkg.types.Kind",
                            "PkgError": "native:PkgError", "run": "pkg.core.run"}
    assert surf["modules"]["pkg.types"]["names"]["__version__"] == "pkg.types.__version__"
    assert top["all"] == ["Kind", "run", "PkgError"]
    box = surf["objects"]["pkg.core.Box"]["members"]
    assert box["__init__"]["params"] == [
        {"name": "a", "kind": "positional_or_keyword", "default": "0"},
        {"name": "b", "kind": "positional_or_keyword", "default": "None"}]  # not the overload
    assert box["size"] == {"kind": "property", "setter": True}
    assert box["make"]["kind"] == "classmethod" and "_private" not in box
    assert surf["objects"]["pkg.core.run"]["params"][-2:] == [
        {"name": "kind", "kind": "keyword_only", "default": "Kind.A"},
        {"name": "kw", "kind": "var_keyword", "default": None}]
    assert surf["objects"]["pkg.types.Kind"]["enum_members"] == ["A", "B"]
    assert surf["objects"]["native:PkgError"]["kind"] == "native exception"


def test_every_not_simulated_reason_is_named():
    assert set(NOT_SIMULATED) == {"infer_to_float", "infer_buffer", "npu_data",
                                  "pinned_memory", "several_models"}
    assert all(len(why) > 40 for why in NOT_SIMULATED.values())


def _wheel() -> Path | None:
    folder = os.environ.get("KVSIM_VENDOR_WHEELS")
    found = sorted(Path(folder).glob("mobilint_qb_runtime-1.5.0-*.whl")) if folder else []
    return found[0] if found else None


@pytest.mark.skipif(_wheel() is None, reason="set KVSIM_VENDOR_WHEELS to a folder holding "
                    "mobilint_qb_runtime-1.5.0-*.whl (pip download --no-deps "
                    "mobilint-qb-runtime==1.5.0) to re-derive the snapshot from the wheel")
def test_the_snapshot_is_what_the_wheel_says():
    sources, version = S.read_sources(_wheel(), "qbruntime")
    assert S.extract(sources, package="qbruntime", distribution="mobilint-qb-runtime",
                     version=version) == S.load_snapshot()


def test_maccel_the_older_name_is_the_same_runtime():
    from sim.runtime.vendor import api

    with S.shim_package(SHIM_DIR, "maccel") as load:
        maccel = load("maccel")
        assert maccel.Model is api.Model and maccel.MAccelError is api.QbRuntimeError
        assert load("maccel.model").load is api.load
        assert load("maccel.maccel").MAccelError is api.QbRuntimeError
        assert "MAccelError" in maccel.__all__ and "QbRuntimeError" not in maccel.__all__
