"""Imports point down the layers: the runtime (elastic) never reaches up into what uses it."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "dyntrain"

# package -> packages it must not import (at module level or inside a function)
FORBIDDEN = {
    "elastic": ("dyntrain.lab", "dyntrain.service", "dyntrain.launch", "dyntrain.cli",
                "dyntrain.workloads", "dyntrain.data"),
    "data": ("dyntrain.lab", "dyntrain.service", "dyntrain.launch", "dyntrain.cli",
             "dyntrain.workloads", "dyntrain.recipes"),
}


def imported_modules(path: Path, package: str) -> list[tuple[int, str]]:
    """Every module that ``path`` imports, as absolute names, with line numbers."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return found


def violations(root: Path, layer: str, forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for path in sorted((root / layer).rglob("*.py")):
        package = "dyntrain." + ".".join(path.relative_to(root).parent.parts)
        for line, name in imported_modules(path, package):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(root)}:{line} imports {name}")
    return bad


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_point_down(layer):
    assert violations(SRC, layer, FORBIDDEN[layer]) == []


def test_the_check_sees_imports_inside_functions_and_relative_ones(tmp_path):
    pkg = tmp_path / "elastic"
    pkg.mkdir()
    (pkg / "a.py").write_text("def f():\n    from dyntrain.lab.fit import fit\n")
    (pkg / "b.py").write_text("from ..service import model\nimport dyntrain.elastic.plan\n")
    assert violations(tmp_path, "elastic", FORBIDDEN["elastic"]) == [
        "elastic/a.py:2 imports dyntrain.lab.fit", "elastic/b.py:1 imports dyntrain.service"]


def test_the_product_never_imports_its_test_tooling():
    """``dyntrain.testing`` (host beds...) serves tests and benchmarks, never the product."""
    layers = sorted(p.name for p in SRC.iterdir() if p.is_dir() and p.name != "testing"
                    and not p.name.startswith("_"))
    bad = [v for layer in layers for v in violations(SRC, layer, ("dyntrain.testing",))]
    assert bad == []
