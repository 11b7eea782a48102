"""The public surface of the vendor's Python runtime, read from its wheel without importing
it, and the mechanical comparison of kvsim's ``qbruntime`` against it.

``mobilint-qb-runtime`` is Python wrappers over a native library (``qbruntime.qbruntime``,
a compiled extension). Importing it loads that library, so the surface is read from the
wrappers' source with :mod:`ast` instead: which modules there are, which names each one
exports (``__all__``, or every public name, following ``from .x import *`` the way Python
does), and for every class and function defined in the package its methods, properties,
enum members and parameters (name, kind, default as source text). Names the package only
re-exports from elsewhere (``numpy``, ``typing``, ``enum``) are not its surface; the one
name it takes from its native library (``qbruntime.qbruntime``, a compiled module named
after the package), ``QbRuntimeError``, is (an exception class).

The snapshot kvsim is tested against (``data/qbruntime-1.5.0.surface.json``) is made by::

    pip download --no-deps mobilint-qb-runtime==1.5.0 -d wheels
    python -m sim.app.vendor.surface extract wheels/mobilint_qb_runtime-1.5.0-*.whl \\
        -o sim/app/vendor/data/qbruntime-1.5.0.surface.json

and ``python -m sim.app.vendor.surface check`` compares kvsim's ``qbruntime`` (the shim that
``kvsim exec`` puts on the path) with it. Compatible means: every module and exported name
exists; a class has every public method and property (and a setter where the vendor's has
one), an enum the same members; a signature accepts every call the vendor's accepts with
the same meaning (the same positional names in the same order, the same keyword names,
the same defaults, extra parameters only with defaults).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import re
import sys
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from kvsim.errors import ConfigError

DATA = Path(__file__).resolve().parent / "data"
#: The snapshot of mobilint-qb-runtime 1.5.0's surface.
QBRUNTIME_SNAPSHOT = DATA / "qbruntime-1.5.0.surface.json"


# --- reading the package ------------------------------------------------------------------


def read_sources(source: str | Path, package: str) -> tuple[dict[str, str], str | None]:
    """``{module: source text}`` of ``package``'s Python files in ``source`` (a wheel, or a
    folder holding the package folder), and the version its wheel metadata states."""
    src = Path(source)
    files: dict[str, str] = {}
    version = None
    if src.is_file() and zipfile.is_zipfile(src):
        with zipfile.ZipFile(src) as z:
            for name in z.namelist():
                if name.startswith(f"{package}/") and name.endswith(".py"):
                    files[name] = z.read(name).decode("utf-8")
                elif name.endswith(".dist-info/METADATA"):
                    m = re.search(r"^Version: (\S+)$", z.read(name).decode("utf-8"), re.M)
                    version = m.group(1) if m else None
    elif (src / package).is_dir():
        for p in sorted((src / package).rglob("*.py")):
            files[p.relative_to(src).as_posix()] = p.read_text(encoding="utf-8")
    else:
        raise ConfigError(f"{src}: neither a wheel nor a folder holding {package}/")
    if f"{package}/__init__.py" not in files:
        raise ConfigError(f"{src}: has no {package}/__init__.py")
    mods = {}
    for name, text in files.items():
        parts = name[:-3].split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = text
    return mods, version


def _params(fn: ast.FunctionDef, *, drop_first: bool) -> list[dict[str, Any]]:
    a = fn.args
    out: list[dict[str, Any]] = []
    pos = [*a.posonlyargs, *a.args]
    defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
    for i, (p, d) in enumerate(zip(pos, defaults, strict=True)):
        kind = "positional_only" if i < len(a.posonlyargs) else "positional_or_keyword"
        out.append({"name": p.arg, "kind": kind,
                    "default": None if d is None else ast.unparse(d)})
    if a.vararg:
        out.append({"name": a.vararg.arg, "kind": "var_positional", "default": None})
    for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        out.append({"name": p.arg, "kind": "keyword_only",
                    "default": None if d is None else ast.unparse(d)})
    if a.kwarg:
        out.append({"name": a.kwarg.arg, "kind": "var_keyword", "default": None})
    return out[1:] if drop_first and out else out


def _decorators(fn: ast.FunctionDef) -> list[str]:
    return [ast.unparse(d) for d in fn.decorator_list]


def _public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def _class(node: ast.ClassDef) -> dict[str, Any]:
    bases = [ast.unparse(b) for b in node.bases]
    enum = any(b.split(".")[-1] == "Enum" for b in bases)
    members: dict[str, dict[str, Any]] = {}
    enum_members = []
    for item in node.body:
        if isinstance(item, ast.Assign) and enum:
            enum_members += [t.id for t in item.targets if isinstance(t, ast.Name)]
        if not isinstance(item, ast.FunctionDef) or not _public(item.name):
            continue
        decs = _decorators(item)
        if "overload" in decs or "typing.overload" in decs:
            continue  # typing stubs; the definition that follows is the one that runs
        if "property" in decs:
            members[item.name] = {"kind": "property", "setter": False}
        elif any(d.endswith(".setter") for d in decs):
            members.setdefault(item.name, {"kind": "property"})["setter"] = True
        elif "classmethod" in decs:
            members[item.name] = {"kind": "classmethod", "params": _params(item, drop_first=True)}
        elif "staticmethod" in decs:
            members[item.name] = {"kind": "staticmethod",
                                  "params": _params(item, drop_first=False)}
        else:
            members[item.name] = {"kind": "method", "params": _params(item, drop_first=True)}
    out: dict[str, Any] = {"kind": "enum" if enum else "class", "bases": bases,
                           "members": dict(sorted(members.items()))}
    if enum:
        out["enum_members"] = enum_members
    return out


class _Module:
    """One module's top-level namespace: name -> where the name comes from."""

    def __init__(self, name: str, tree: ast.Module, is_package: bool):
        self.name, self.tree, self.is_package = name, tree, is_package
        self.defs: dict[str, dict[str, Any]] = {}
        self.all: list[str] | None = None

    def resolve(self, level: int, module: str | None) -> str:
        base = self.name.split(".")
        base = base if self.is_package else base[:-1]
        base = base[: len(base) - (level - 1)]
        return ".".join([*base, *([module] if module else [])])


def _namespace(mods: dict[str, _Module], name: str, package: str,
               memo: dict[str, dict[str, str]]) -> dict[str, str]:
    """``{name: origin}`` of module ``name`` after its top level ran, where origin is
    ``"<module>.<name>"`` for what the package defines, ``"native:<name>"`` for what it takes
    from its native library and ``"external"`` for everything else."""
    if name in memo:
        return memo[name]
    memo[name] = {}  # a cycle sees what is known so far, as Python's import would
    m = mods[name]
    ns: dict[str, str] = {}
    for node in m.tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            ns[node.name] = f"{name}.{node.name}"
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    ns[t.id] = f"{name}.{t.id}"
                    if t.id == "__all__" and isinstance(node.value, ast.List | ast.Tuple):
                        m.all = [ast.literal_eval(e) for e in node.value.elts]
        elif isinstance(node, ast.ImportFrom):
            src = m.resolve(node.level, node.module) if node.level else (node.module or "")
            native = src == f"{package}.{package}"  # the compiled library
            for a in node.names:
                if a.name == "*":
                    if src in mods:
                        inner = _namespace(mods, src, package, memo)
                        for k in mods[src].all or [k for k in inner if not k.startswith("_")]:
                            ns[k] = inner.get(k, "external")
                    continue
                if native:
                    ns[a.asname or a.name] = f"native:{a.name}"
                elif src in mods:
                    ns[a.asname or a.name] = _namespace(mods, src, package, memo).get(
                        a.name, f"{src}.{a.name}" if f"{src}.{a.name}" in mods else "external")
                else:
                    ns[a.asname or a.name] = "external"
        elif isinstance(node, ast.Import):
            for a in node.names:
                ns[a.asname or a.name.split(".")[0]] = "external"
    memo[name] = ns
    return ns


def extract(sources: dict[str, str], *, package: str, distribution: str,
            version: str | None) -> dict[str, Any]:
    """The surface of ``package`` from its modules' sources (:func:`read_sources`)."""
    mods = {n: _Module(n, ast.parse(t, filename=n),
                       any(k.startswith(n + ".") for k in sources)) for n, t in sources.items()}
    memo: dict[str, dict[str, str]] = {}
    objects: dict[str, dict[str, Any]] = {}
    for n, m in sorted(mods.items()):
        for node in m.tree.body:
            if isinstance(node, ast.ClassDef):
                objects[f"{n}.{node.name}"] = _class(node)
            elif isinstance(node, ast.FunctionDef):
                objects[f"{n}.{node.name}"] = {"kind": "function",
                                               "params": _params(node, drop_first=False)}
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                objects[f"{n}.{node.target.id}"] = {"kind": "constant",
                                                    "type": ast.unparse(node.annotation)}
    modules: dict[str, dict[str, Any]] = {}
    for n in sorted(mods):
        if n.split(".")[-1].startswith("_"):
            continue
        names = {}
        for k, origin in sorted(_namespace(mods, n, package, memo).items()):
            if origin == "external" or k == "__all__" or (k.startswith("_")
                                                         and not k.endswith("__")):
                continue
            if origin.startswith("native:"):
                objects.setdefault(origin, {"kind": "native exception"
                                            if k.endswith("Error") else "native"})
            names[k] = origin
        modules[n] = {"names": names, "all": mods[n].all}
    used = {o for m in modules.values() for o in m["names"].values()}
    return {"package": package, "distribution": distribution, "version": version,
            "modules": modules,
            "objects": {k: v for k, v in sorted(objects.items()) if k in used}}


# --- comparing kvsim's package with it ----------------------------------------------------


def _same_default(a: Any, b: Any) -> bool:
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same_default(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def check_signature(where: str, vendor: list[dict[str, Any]], fn: Callable,
                    namespace: dict[str, Any], *, drop_first: bool) -> list[str]:
    """What keeps ``fn`` from accepting every call ``vendor``'s parameters accept."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as err:
        return [f"{where}: no signature ({err})"]
    ours = list(sig.parameters.values())
    if drop_first and ours and ours[0].kind is not inspect.Parameter.VAR_POSITIONAL:
        ours = ours[1:]
    P = inspect.Parameter
    positional = [p for p in ours if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    by_name = {p.name: p for p in ours}
    problems = []
    vpos = [v for v in vendor if v["kind"] in ("positional_only", "positional_or_keyword")]
    for i, v in enumerate(vpos):
        if i >= len(positional) or positional[i].name != v["name"]:
            have = repr(positional[i].name) if i < len(positional) else "missing"
            problems.append(f"{where}: positional parameter {i} is {have}, the vendor's "
                            f"is {v['name']!r}")
    for v in vendor:
        if v["kind"] in ("var_positional", "var_keyword"):
            kind = P.VAR_POSITIONAL if v["kind"] == "var_positional" else P.VAR_KEYWORD
            if not any(p.kind is kind for p in ours):
                problems.append(f"{where}: lacks the vendor's {v['kind']} {v['name']!r}")
            continue
        p = by_name.get(v["name"])
        if p is None or p.kind is P.POSITIONAL_ONLY:
            if not any(q.kind is P.VAR_KEYWORD for q in ours):
                problems.append(f"{where}: lacks the keyword {v['name']!r}")
            continue
        if v["default"] is None:
            continue
        if p.default is P.empty:
            problems.append(f"{where}: {v['name']!r} has no default, the vendor's is "
                            f"{v['default']}")
            continue
        try:
            want = eval(v["default"], dict(namespace))  # noqa: S307 - the vendor's literal
        except Exception as err:  # a default naming what kvsim lacks
            problems.append(f"{where}: default of {v['name']!r} ({v['default']}) does not "
                            f"evaluate in kvsim's module: {err!r}")
            continue
        if not _same_default(p.default, want):
            problems.append(f"{where}: default of {v['name']!r} is {p.default!r}, the "
                            f"vendor's is {v['default']}")
    vendor_names = {v["name"] for v in vendor}
    for p in ours[len(vpos):] if len(positional) >= len(vpos) else []:
        if p.name in vendor_names or p.kind in (P.VAR_POSITIONAL, P.VAR_KEYWORD):
            continue
        if p.default is P.empty:
            problems.append(f"{where}: kvsim's extra parameter {p.name!r} has no default")
    return problems


def _check_class(where: str, want: dict[str, Any], cls: Any,
                 namespace: dict[str, Any]) -> list[str]:
    if not inspect.isclass(cls):
        return [f"{where}: is {type(cls).__name__}, the vendor's is a class"]
    problems = []
    if want["kind"] == "enum":
        have = [m.name for m in cls] if hasattr(cls, "__members__") else None
        if have != want["enum_members"]:
            problems.append(f"{where}: enum members {have}, the vendor's {want['enum_members']}")
    for name, m in want["members"].items():
        w = f"{where}.{name}"
        raw = inspect.getattr_static(cls, name, None)
        if raw is None:
            problems.append(f"{w}: missing")
            continue
        if m["kind"] == "property":
            if not isinstance(raw, property):
                problems.append(f"{w}: is not a property")
            elif m.get("setter") and raw.fset is None:
                problems.append(f"{w}: has no setter")
            continue
        kinds = {"classmethod": classmethod, "staticmethod": staticmethod}
        if m["kind"] in kinds and not isinstance(raw, kinds[m["kind"]]):
            problems.append(f"{w}: is not a {m['kind']}")
            continue
        problems += check_signature(w, m["params"], getattr(cls, name), namespace,
                                    drop_first=m["kind"] == "method")
    return problems


def compare(surface: dict[str, Any], load: Callable[[str], ModuleType]) -> list[str]:
    """Every way kvsim's package (``load(module_name)`` imports one of its modules) falls
    short of ``surface``; empty when it covers it."""
    problems = []
    top = load(surface["package"])
    namespace = vars(top)
    for mod_name, entry in surface["modules"].items():
        try:
            mod = load(mod_name)
        except ImportError as err:
            problems.append(f"{mod_name}: cannot be imported ({err})")
            continue
        if entry["all"] is not None and sorted(getattr(mod, "__all__", ())) != sorted(
                entry["all"]):
            problems.append(f"{mod_name}.__all__: {sorted(getattr(mod, '__all__', ()))}, the "
                            f"vendor's {sorted(entry['all'])}")
        for name, origin in entry["names"].items():
            where = f"{mod_name}.{name}"
            if not hasattr(mod, name):
                problems.append(f"{where}: missing")
                continue
            obj = getattr(mod, name)
            want = surface["objects"][origin]
            if want["kind"] in ("class", "enum"):
                problems += _check_class(where, want, obj, namespace)
            elif want["kind"] == "function":
                if not callable(obj):
                    problems.append(f"{where}: is not callable")
                else:
                    problems += check_signature(where, want["params"], obj, namespace,
                                                drop_first=False)
            elif want["kind"] == "native exception":
                if not (inspect.isclass(obj) and issubclass(obj, Exception)):
                    problems.append(f"{where}: is not an exception class")
            elif want["kind"] == "constant" and not isinstance(obj, str):
                problems.append(f"{where}: is not a string")
    return problems


@contextmanager
def shim_package(shim_dir: str | Path, package: str) -> Iterator[Callable[[str], ModuleType]]:
    """Import ``package`` from ``shim_dir`` for the duration (the folder first on the path,
    the package's modules forgotten afterwards, so nothing outlives the block)."""
    shim_dir = str(shim_dir)
    saved = {k: v for k, v in sys.modules.items() if k == package or k.startswith(package + ".")}
    for k in saved:
        del sys.modules[k]
    sys.path.insert(0, shim_dir)
    try:
        yield importlib.import_module
    finally:
        sys.path.remove(shim_dir)
        for k in [k for k in sys.modules if k == package or k.startswith(package + ".")]:
            del sys.modules[k]
        sys.modules.update(saved)


def load_snapshot(path: str | Path = QBRUNTIME_SNAPSHOT) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.app.vendor.surface",
                                 description="read the vendor runtime's surface from its "
                                 "wheel; compare kvsim's qbruntime with a snapshot")
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("extract", help="write the surface of a wheel as JSON")
    ex.add_argument("wheel", help="mobilint_qb_runtime-*.whl (or a folder holding qbruntime/)")
    ex.add_argument("--package", default="qbruntime")
    ex.add_argument("--distribution", default="mobilint-qb-runtime")
    ex.add_argument("-o", "--output", help="output file (default: stdout)")
    ck = sub.add_parser("check", help="compare kvsim's shim package with a snapshot")
    ck.add_argument("snapshot", nargs="?", default=str(QBRUNTIME_SNAPSHOT))
    args = ap.parse_args(argv)
    if args.cmd == "extract":
        sources, version = read_sources(args.wheel, args.package)
        text = json.dumps(extract(sources, package=args.package,
                                  distribution=args.distribution, version=version),
                          indent=1) + "\n"
        if args.output:
            from kvsim.files import atomic_write_text

            atomic_write_text(args.output, text)
        else:
            sys.stdout.write(text)
        return 0
    from sim.runtime.vendor import SHIM_DIR

    surface = load_snapshot(args.snapshot)
    with shim_package(SHIM_DIR, surface["package"]) as load:
        problems = compare(surface, load)
    for p in problems:
        print(p)
    n = sum(len(v["names"]) for v in surface["modules"].values())
    print(f"{surface['package']} {surface['version']}: {n} exported names in "
          f"{len(surface['modules'])} modules, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
