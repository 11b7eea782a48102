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
