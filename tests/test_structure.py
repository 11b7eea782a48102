"""Structure guards: the compiler and the instruction set stay in files a reader can hold
(at most 500 lines), no module of the compiler reaches into another's private names, and
the block registry lists every block module (a new block is one file plus one registry
line)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 500
#: the folders whose files must stay under MAX_LINES
SIZED = ("models/compiler", "isa")


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def _sized_files() -> list[Path]:
    return sorted(p for folder in SIZED for p in (ROOT / folder).rglob("*.py"))


def test_no_file_over_500_lines_in_the_compiler_and_the_isa():
    over = {p.relative_to(ROOT).as_posix(): _lines(p) for p in _sized_files()
            if _lines(p) > MAX_LINES}
    assert over == {}, f"files over {MAX_LINES} lines: {over}"


def test_the_size_check_sees_the_compiler_and_isa_files():
    names = {p.relative_to(ROOT).as_posix() for p in _sized_files()}
    assert {"models/compiler/driver.py", "models/compiler/blocks/gqa.py",
            "isa/kv/region.py", "isa/instructions.py"} <= names


# --- private names ----------------------------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The absolute module an ``ImportFrom`` names."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(path: Path, text: str | None = None) -> list[str]:
    """``module: name`` of every private name ``path`` (its ``text``, default: read it)
    imports from another module of the project, by ``from M import _x`` or as ``m._x`` of a
    module ``m`` it imported."""
    module = _module_name(path)
    tree = ast.parse(path.read_text() if text is None else text, filename=str(path))
    found = []
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _resolve(module, node, path.name == "__init__.py")
            if source.split(".")[0] not in ("isa", "models", "sim", "traces"):
                continue
            for a in node.names:
                if _private(a.name) and source != module:
                    found.append(f"{source}: {a.name}")
                aliases.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in ("isa", "models", "sim", "traces"):
                    aliases.add(a.asname or a.name.split(".")[0])
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _private(node.attr)
                and isinstance(node.value, ast.Name) and node.value.id in aliases):
            found.append(f"{node.value.id}: {node.attr}")
    return found


def test_no_private_name_is_imported_across_compiler_modules():
    bad = {p.relative_to(ROOT).as_posix(): private_imports(p)
           for p in sorted((ROOT / "models" / "compiler").rglob("*.py"))}
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_private_import_check_finds_what_it_looks_for():
    # a file as the compiler would hold it: both shapes of reaching into another module,
    # and what is allowed (public names, dunders, its own private names, other libraries)
    probe = ROOT / "models" / "compiler" / "blocks" / "probe.py"
    text = ("from __future__ import annotations\nfrom ..builder import Builder, _hidden\n"
            "from .. import sram\nx = sram._plan\nfrom numpy import _core\n"
            "from .probe import _mine\nimport models.compiler.ops as ops\ny = ops._z\n")
    assert private_imports(probe, text) == ["models.compiler.builder: _hidden", "sram: _plan",
                                            "ops: _z"]


# --- the block registry -----------------------------------------------------------------------

BLOCKS = "models.compiler.blocks"
#: modules of the blocks folder that are not blocks, and why
NOT_BLOCKS = {
    "base": "the protocols every block implements",
    "registry": "the registry itself",
    "io": "the model's input and output head: every model has them, none is chosen",
}


def _protocol_methods(protocol: type) -> set[str]:
    return {n for n, v in vars(protocol).items() if not n.startswith("_") and callable(v)}


def _block_classes(module) -> list[type]:
    """The classes defined in ``module`` that implement a block protocol."""
    from models.compiler.blocks.base import AttentionBlock, MlpBlock

    wanted = [_protocol_methods(AttentionBlock), _protocol_methods(MlpBlock)]
    return [c for _, c in inspect.getmembers(module, inspect.isclass)
            if c.__module__ == module.__name__
            and any(all(callable(getattr(c, m, None)) for m in w) for w in wanted)]


def test_the_registry_lists_every_block_module():
    from models.compiler.blocks import registry

    registered = {*registry.ATTENTION.values(), *registry.MLP.values()}
    modules = sorted(m.name for m in pkgutil.iter_modules(
        [str(ROOT / "models" / "compiler" / "blocks")]))
    blocks: dict[str, list[type]] = {}
    for name in (n for n in modules if n not in NOT_BLOCKS):
        classes = _block_classes(importlib.import_module(f"{BLOCKS}.{name}"))
        if classes:
            blocks[name] = classes
    # every block class is registered, and every registered class is a block of the folder
    assert {c for cs in blocks.values() for c in cs} == registered
    # one block per file
    assert {k: v for k, v in blocks.items() if len(v) != 1} == {}
    # every other module is named above or is a helper of one block (``<block>_*.py``)
    others = [n for n in modules if n not in blocks and n not in NOT_BLOCKS
              and not any(n.startswith(f"{b}_") for b in blocks)]
    assert others == [], ("modules in blocks/ that are neither a registered block, nor a "
                          "helper named after one, nor listed in NOT_BLOCKS")
    assert set(NOT_BLOCKS) <= set(modules)


def test_registry_keys_are_the_blocks_kinds():
    from models.compiler.blocks import registry

    for table in (registry.ATTENTION, registry.MLP):
        for kind, cls in table.items():
            assert getattr(cls, "kind", kind) == kind, cls


# --- imports: no cycle inside any package, and the layers ---------------------------------------

#: The project's packages (the top-level folders that hold code the others import).
PACKAGES = ("kvsim", "isa", "models", "traces", "sim")


def _module_files() -> dict[str, Path]:
    return {_module_name(p): p for top in PACKAGES for p in sorted((ROOT / top).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return "TYPE_CHECKING" in ast.unparse(test)


def _imports(tree: ast.AST):
    """Every import node of ``tree``, at any depth (a function's imports count: they run
    when it does), except those under ``if TYPE_CHECKING:`` (they never run)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from (n for orelse in node.orelse for n in _imports_of(orelse))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _imports(node)


def _imports_of(node: ast.AST):
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    yield from _imports(node)


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """module -> the project modules it imports, from ``sources`` (module -> (its text,
    whether it is a package's ``__init__``)). ``from P import x`` depends on ``P`` (its
    ``__init__`` runs, and ``x`` is read from it) and on ``P.x`` when that is a module;
    ``import P.x`` on ``P.x``."""
    graph: dict[str, set[str]] = {m: set() for m in sources}

    def known(name: str) -> str | None:
        while name and name not in graph:
            name = name.rpartition(".")[0]
        return name or None

    for module, (text, is_package) in sources.items():
        for node in _imports(ast.parse(text)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                source = _resolve(module, node, is_package)
                targets = [source, *(f"{source}.{a.name}" for a in node.names)]
            for target in targets:
                found = known(target)
                if found is not None and found != module:
                    graph[module].add(found)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def package_of(modules: list[str], packages: set[str]) -> str:
    """The innermost package holding every one of ``modules`` ("" if none does)."""
    homes = [m if m in packages else m.rpartition(".")[0] for m in modules]
    common = homes[0].split(".")
    for home in homes[1:]:
        parts = home.split(".")
        n = 0
        while n < min(len(common), len(parts)) and common[n] == parts[n]:
            n += 1
        common = common[:n]
    return ".".join(common)


def _project_graph() -> tuple[dict[str, set[str]], set[str]]:
    files = _module_files()
    sources = {m: (p.read_text(), p.name == "__init__.py") for m, p in files.items()}
    packages = {m for m, p in files.items() if p.name == "__init__.py"}
    return import_graph(sources), packages


_GRAPH = _project_graph()
#: every package of the project (a folder with an ``__init__.py``)
ALL_PACKAGES = sorted(_GRAPH[1])


def cycles_by_package() -> dict[str, list[list[str]]]:
    graph, packages = _GRAPH
    out: dict[str, list[list[str]]] = {p: [] for p in packages}
    for cycle in import_cycles(graph):
        out.setdefault(package_of(cycle, packages), []).append(cycle)
    return out


def test_import_cycles_per_package_are_counted_for_every_package():
    found = cycles_by_package()
    print("\nimport cycles inside each package (a cycle counts in the innermost package "
          "that holds all its modules):")
    for package in sorted(found):
        print(f"  {package or '(across packages)'}: {len(found[package])}")
        for cycle in found[package]:
            print("     ", " <-> ".join(cycle))
    assert {"sim", "sim.app", "sim.device", "sim.runtime", "sim.serving", "models",
            "models.compiler", "isa", "isa.kv", "traces", "kvsim"} <= set(found)


@pytest.mark.parametrize("package", ALL_PACKAGES)
def test_no_import_cycle_inside(package):
    assert cycles_by_package()[package] == []


def test_no_import_cycle_across_packages():
    assert cycles_by_package().get("", []) == []


def test_the_cycle_check_finds_what_it_looks_for():
    pkg = ("from .a import f\n", True)
    sources = {
        "p": pkg,
        # p/__init__ imports a; a reaches back into the package: a cycle
        "p.a": ("from . import b\ndef f():\n    from p import c\n", False),
        "p.b": ("x = 1\n", False),
        "p.c": ("import p.b as b\n", False),
        # q.x and q.y import each other, one of them inside a function: still a cycle;
        # q.z imports q.x only for type checking: no cycle
        "q": ("", True),
        "q.x": ("def g():\n    from .y import h\n", False),
        "q.y": ("from q.x import g\n", False),
        "q.z": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .x import g\n",
                False),
        "q.w": ("from .z import k\n", False),
    }
    graph = import_graph(sources)
    assert graph["p.a"] == {"p", "p.b", "p.c"} and graph["p.c"] == {"p.b"}
    assert graph["q.z"] == set()
    cycles = import_cycles(graph)
    assert sorted(cycles) == [["p", "p.a"], ["q.x", "q.y"]]
    assert [package_of(c, {"p", "q"}) for c in sorted(cycles)] == ["p", "q"]
    assert package_of(["p.a", "q.x"], {"p", "q"}) == ""


# --- layers: which package may import which -----------------------------------------------------

#: The layers, lowest first, each with the layers it may import (besides its own).
#: ``sim.base`` is what every part of the simulator shares (units, progress display).
LAYERS: dict[str, frozenset[str]] = {
    "kvsim": frozenset(),
    "isa": frozenset({"kvsim"}),
    "models": frozenset({"isa", "kvsim"}),
    "traces": frozenset({"kvsim"}),
    "sim.base": frozenset({"kvsim"}),
    "sim.device": frozenset({"sim.base", "isa", "models", "traces", "kvsim"}),
    "sim.runtime": frozenset({"sim.device", "sim.base", "isa", "models", "traces", "kvsim"}),
    "sim.serving": frozenset({"sim.runtime", "sim.device", "sim.base", "isa", "models",
                              "traces", "kvsim"}),
    "sim.app": frozenset({"sim.serving", "sim.runtime", "sim.device", "sim.base", "isa",
                          "models", "traces", "kvsim"}),
}
#: sim's top-level modules and the layer each belongs to
SIM_TOP = {"sim": "sim.app", "sim.__main__": "sim.app", "sim.testing": "sim.app",
           "sim.units": "sim.base", "sim.progress": "sim.base"}


def layer_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "sim":
        return parts[0]
    if module in SIM_TOP:
        return SIM_TOP[module]
    return ".".join(parts[:2])


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """``importer -> imported`` of every import that goes up or sideways between layers."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                  if layer_of(t) != layer_of(m) and layer_of(t) not in LAYERS[layer_of(m)])


def test_every_module_has_a_layer():
    assert {layer_of(m) for m in _GRAPH[0]} == set(LAYERS)


def test_imports_follow_the_layers():
    # sim -> models -> isa, sim -> traces; the application imports the device, never the
    # reverse; models never reaches into traces (nor isa into models)
    assert layer_violations(_GRAPH[0]) == []


def test_the_layer_check_finds_what_it_looks_for():
    graph = {"models.config": {"traces.io"}, "isa.asm": {"sim.units"},
             "sim.device.hw": {"sim.app.run", "sim.units", "models.config"},
             "sim.app.run": {"sim.device.hw", "traces.report"}, "sim.units": set(),
             "traces.io": set(), "sim.app.cli": {"sim.app.run"}}
    assert layer_violations(graph) == ["isa.asm -> sim.units", "models.config -> traces.io",
                                       "sim.device.hw -> sim.app.run"]


def test_sims_top_level_is_a_handful_of_files():
    top = sorted(p.name for p in (ROOT / "sim").glob("*.py") if p.name != "__init__.py")
    assert set(top) <= {f"{m.rpartition('.')[2]}.py" for m in SIM_TOP} and len(top) <= 5
