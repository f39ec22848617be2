"""The package's layers: imports only point down, no module takes another's private name, no file
is over 400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import tvm_convgrad

PACKAGE = Path(tvm_convgrad.__file__).parent
LAYERS = [  # bottom first: a module may import from its own layer and the ones before it
    {"errors", "layout", "machine", "tvm", "tvmscript", "isa", "reference", "params"},
    {"dsl"},
    {"schedule"},
    {"compile"},
    {"tuning"},
    {"frontends", "examples", "tools"},
    {"torch", "relax"},
    {"training"},
    {"cli", "__init__"},
]


def _layer(module: str) -> int:
    top = module.split(".")[0]
    return next(i for i, names in enumerate(LAYERS) if top in names)


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).with_suffix("")
        yield ".".join(relative.parts), path


def _imports(name: str, path: Path):
    """``(imported module relative to the package, names)`` of every package import in ``path``."""
    package = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".")[:-1]
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1] if node.level > 1 else package
            target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            yield target, [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tvm_convgrad"):
            yield node.module.removeprefix("tvm_convgrad").lstrip("."), [a.name for a in node.names]


def test_imports_point_down_and_take_no_private_names():
    upward, private = [], []
    for name, path in _modules():
        for target, names in _imports(name, path):
            if not target:
                target = names[0]  # "from . import dsl"
            if _layer(target) > _layer(name):
                upward.append(f"{name} -> {target}")
            private += [f"{name} takes {target}.{n}" for n in names if n.startswith("_") and n != "__version__"]
    assert not upward, upward
    assert not private, private


def test_no_file_is_over_400_lines():
    long = {name: len(path.read_text().splitlines()) for name, path in _modules() if len(path.read_text().splitlines()) > 400}
    assert not long, long
