"""Imports point down the layers: the runtime (elastic) never reaches up into what uses it, and
the service's own layers (core <- store <- engine <- operations <- front ends, executors beside
the operations) point down too; the front ends reach the service only by its operations."""

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
    # an adapter builds a trainer from another framework's code: the runtime and nothing above
    "adapters": ("dyntrain.lab", "dyntrain.service", "dyntrain.launch", "dyntrain.cli",
                 "dyntrain.workloads"),
}



def _service(*parts: str) -> tuple[str, ...]:
    return tuple(f"dyntrain.service.{p}" for p in parts)


# Inside the service: core (pure) <- store <- engine <- operations (the one way in) <- the front
# ends (api, aws, web), which never import each other; the executors sit on core alone; assembly
# (which chooses and builds the executor), server (which puts the front ends together) and client
# sit above them all.
FRONT_ENDS = ("api", "aws", "web")
ABOVE_ENGINE = ("operations", "executors", *FRONT_ENDS, "assembly", "server", "client")
# importlib: core names no implementation, not even as a string to import later
NOT_PURE = ("sqlalchemy", "fastapi", "starlette", "pydantic", "uvicorn", "httpx", "jinja2",
            "prometheus_client", "botocore", "ray", "torch", "subprocess", "multiprocessing",
            "socket", "threading", "importlib")
SERVICE_FORBIDDEN = {
    "service/core": _service("store", "engine", *ABOVE_ENGINE) + NOT_PURE,
    "service/store": _service("engine", *ABOVE_ENGINE),
    "service/engine": _service(*ABOVE_ENGINE),
    "service/executors": _service("store", "engine", "operations", *FRONT_ENDS, "assembly",
                                  "server", "client"),
    "service/operations": _service("executors", *FRONT_ENDS, "assembly", "server", "client")
    + ("fastapi", "starlette", "pydantic", "botocore", "jinja2"),
    "service/api": _service("aws", "web", "assembly", "server", "executors", "store"),
    "service/aws": _service("api", "web", "assembly", "server", "executors", "store"),
    "service/web": _service("api", "aws", "assembly", "server", "executors", "store")
    + ("dyntrain.lab",),
    # the assembly builds the service; the front ends are put together by server.py
    "service/assembly.py": _service(*FRONT_ENDS, "server", "client"),
    "service/server.py": _service("executors", "assembly"),
    "service/client.py": _service("store", "engine", "operations", *FRONT_ENDS, "executors",
                                  "assembly", "server") + ("sqlalchemy", "fastapi", "torch"),
}
# The runtime's rooms, lowest first: each imports only the rooms before it and the vocabulary that
# every room shares (the modules at elastic's root but the trainer). ``membership`` (the
# coordinator's side) and ``worker`` (the worker's side) speak through the protocol, never through
# each other's code; ``trainer.py``, the step loop users call, stands on all of them.
VOCABULARY = ("config", "state", "wire", "protocol", "numerics", "admission")
ROOMS = ("runs", "collective", "sharding", "step", "membership", "worker")


def _elastic(*parts: str) -> tuple[str, ...]:
    return tuple(f"dyntrain.elastic.{p}" for p in parts)


ELASTIC_FORBIDDEN = {
    **{f"elastic/{m}.py": _elastic(*ROOMS, "trainer") for m in VOCABULARY},
    **{f"elastic/{room}": _elastic(*ROOMS[i + 1:], "trainer") for i, room in enumerate(ROOMS)},
}
ELASTIC_FORBIDDEN["elastic/worker"] += _elastic("membership")

# what only the operations may touch on the service: its store and its lock
SERVICE_INSIDES = ("store", "lock")


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:``: names for annotations, never loaded."""
    hidden = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            hidden |= {id(inner) for stmt in node.body for inner in ast.walk(stmt)}
    return hidden


def imported_modules(path: Path, package: str) -> list[tuple[int, str]]:
    """Every module that ``path`` imports, as absolute names, with line numbers (but those under
    ``if TYPE_CHECKING:``, which are never imported when it runs)."""
    found = []
    tree = ast.parse(path.read_text(), filename=str(path))
    hidden = _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
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


def _modules(root: Path, layer: str) -> list[Path]:
    top = root / layer
    return sorted(top.rglob("*.py") if top.is_dir() else [top])


def violations(root: Path, layer: str, forbidden: tuple[str, ...],
               aliases: frozenset[tuple[str, str]] = frozenset()) -> list[str]:
    """Every import of a ``forbidden`` module by a module of ``layer`` (a package folder or one
    module's file), but the ``aliases`` (module, imported) allowed."""
    bad = []
    for path in _modules(root, layer):
        where = path.relative_to(root)
        package = "dyntrain." + ".".join(where.parent.parts)
        for line, name in imported_modules(path, package):
            if ((where.as_posix(), name) not in aliases
                    and any(name == f or name.startswith(f + ".") for f in forbidden)):
                bad.append(f"{where}:{line} imports {name}")
    return bad


def attribute_uses(root: Path, layer: str, attributes: tuple[str, ...]) -> list[str]:
    """Every ``x.<attribute>`` (read, written or called) in a module of ``layer``, for the
    ``attributes`` named."""
    bad = []
    for path in _modules(root, layer):
        where = path.relative_to(root)
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Attribute) and node.attr in attributes:
                bad.append(f"{where}:{node.lineno} uses .{node.attr}")
    return sorted(bad, key=lambda v: (v.split(":")[0], int(v.split(":")[1].split()[0])))


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_point_down(layer):
    assert violations(SRC, layer, FORBIDDEN[layer]) == []


@pytest.mark.parametrize("room", sorted(ELASTIC_FORBIDDEN))
def test_the_runtimes_rooms_import_down(room):
    assert violations(SRC, room, ELASTIC_FORBIDDEN[room]) == []


def test_every_runtime_module_lives_in_a_room():
    """A module dropped at elastic's root would escape the rooms' rules."""
    loose = {p.stem for p in (SRC / "elastic").glob("*.py")} - {*VOCABULARY, "trainer", "__init__"}
    rooms = {p.name for p in (SRC / "elastic").iterdir() if p.is_dir() and p.name[0] != "_"}
    assert (loose, rooms) == (set(), set(ROOMS))


@pytest.mark.parametrize("layer", sorted(SERVICE_FORBIDDEN))
def test_service_layer_imports_point_down(layer):
    assert violations(SRC, layer, SERVICE_FORBIDDEN[layer]) == []


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_a_front_end_reaches_the_service_only_by_its_operations(front_end):
    """No front end touches the store or takes the service's lock: the operations own both,
    so one operation follows one rule whichever front end calls it."""
    assert attribute_uses(SRC, f"service/{front_end}", SERVICE_INSIDES) == []


def test_the_front_end_check_sees_the_store_and_the_lock(tmp_path):
    (tmp_path / "service" / "aws").mkdir(parents=True)
    (tmp_path / "service" / "aws" / "a.py").write_text(
        "def submit(ctx, p):\n    with ctx.service.lock:\n"
        "        return ctx.service.store.jobs.submit(**p)\n"
        "def read(service):\n    store = service.store\n    return store.jobs.get_job('x')\n"
        "from dyntrain.service.store import Store\n")
    assert attribute_uses(tmp_path, "service/aws", SERVICE_INSIDES) == [
        "service/aws/a.py:2 uses .lock", "service/aws/a.py:3 uses .store",
        "service/aws/a.py:5 uses .store"]
    assert violations(tmp_path, "service/aws", SERVICE_FORBIDDEN["service/aws"]) == [
        "service/aws/a.py:7 imports dyntrain.service.store"]


def test_the_service_check_sees_each_kind_of_violation(tmp_path):
    for folder in ("core", "web", "engine"):
        (tmp_path / "service" / folder).mkdir(parents=True)
    (tmp_path / "service" / "core" / "a.py").write_text(
        "import subprocess\ndef f():\n    from sqlalchemy import select\n"
        "REGISTRY = {'local': 'dyntrain.service.executors.local:LocalExecutor'}\n"
        "def get(name):\n    import importlib\n")
    (tmp_path / "service" / "web" / "b.py").write_text(
        "from ..api import views\nfrom dyntrain.service.engine import views\n"
        "def f():\n    import dyntrain.lab.analysis\n")
    (tmp_path / "service" / "engine" / "c.py").write_text(
        "from dyntrain.service.executors.local import LocalExecutor\n")
    assert violations(tmp_path, "service/core", SERVICE_FORBIDDEN["service/core"]) == [
        "service/core/a.py:1 imports subprocess", "service/core/a.py:3 imports sqlalchemy",
        "service/core/a.py:6 imports importlib"]
    assert violations(tmp_path, "service/web", SERVICE_FORBIDDEN["service/web"]) == [
        "service/web/b.py:1 imports dyntrain.service.api",
        "service/web/b.py:4 imports dyntrain.lab.analysis"]
    assert violations(tmp_path, "service/engine", SERVICE_FORBIDDEN["service/engine"]) == [
        "service/engine/c.py:1 imports dyntrain.service.executors.local"]
    allowed = frozenset({("service/engine/c.py", "dyntrain.service.executors.local")})
    assert violations(tmp_path, "service/engine", SERVICE_FORBIDDEN["service/engine"],
                      allowed) == []


def test_the_check_sees_imports_inside_functions_and_relative_ones(tmp_path):
    pkg = tmp_path / "elastic"
    pkg.mkdir()
    (pkg / "a.py").write_text("def f():\n    from dyntrain.lab.fit import fit\n"
                              "if TYPE_CHECKING:\n    from dyntrain.lab.plots import plot\n")
    (pkg / "b.py").write_text("from ..service import model\nimport dyntrain.elastic.step.chunks\n")
    assert violations(tmp_path, "elastic", FORBIDDEN["elastic"]) == [
        "elastic/a.py:2 imports dyntrain.lab.fit", "elastic/b.py:1 imports dyntrain.service"]


def test_the_product_never_imports_its_test_tooling():
    """``dyntrain.testing`` (host beds...) serves tests and benchmarks, never the product."""
    layers = sorted(p.name for p in SRC.iterdir() if p.is_dir() and p.name != "testing"
                    and not p.name.startswith("_"))
    bad = [v for layer in layers for v in violations(SRC, layer, ("dyntrain.testing",))]
    assert bad == []


def test_only_an_adapter_may_import_a_training_framework():
    """Lightning is the adapter's business (and the user's): no other package imports it, so it
    never becomes a dependency of the core."""
    layers = sorted(p.name for p in SRC.iterdir() if p.is_dir() and p.name != "adapters"
                    and not p.name.startswith("_"))
    frameworks = ("lightning", "pytorch_lightning")
    bad = [v for layer in layers for v in violations(SRC, layer, frameworks)]
    bad += [v for p in sorted(SRC.glob("*.py")) for v in violations(SRC, p.name, frameworks)]
    assert bad == []


MAX_LINES = 500  # the house rule: small modules


def long_modules(root: Path) -> dict[str, int]:
    """Every module under ``root`` over ``MAX_LINES`` lines, with its length."""
    return {p.relative_to(root).as_posix(): n for p in sorted(root.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES}


def test_no_module_is_over_500_lines():
    assert long_modules(SRC) == {}


def test_the_size_check_counts_lines_of_every_module(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "sub" / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "pkg" / "ok.py").write_text("x = 1\n" * MAX_LINES)
    assert long_modules(tmp_path) == {"pkg/sub/big.py": MAX_LINES + 1}


def test_the_service_and_the_cli_start_without_torch():
    """Importing torch takes seconds of CPU: the server, its pages (which list checkpoints) and
    the CLI load it only where a job's run needs it (hosting an elastic job, a checkpoint's
    contents), never at start."""
    import subprocess
    import sys

    probe = ("import sys, dyntrain.cli.main, dyntrain.service.server, "
             "dyntrain.service.web.runfiles, dyntrain.elastic.runs.checkpoints; "
             "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


def re_exports(path: Path) -> list[str]:
    """Names a module passes on without defining them: imported and listed in its ``__all__``,
    or imported ``as`` their own name (``from m import x as x``). A package's ``__init__``
    is its front door and may list its modules' names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    imported, listed, found = set(), set(), []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                imported.add(alias.asname or alias.name.split(".")[0])
                if alias.asname is not None and alias.asname == alias.name.split(".")[-1]:
                    found.append(f"{alias.name} as {alias.asname}")
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            listed = {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    if path.name != "__init__.py":
        found += sorted(f"__all__ lists {name}" for name in listed & imported)
    return found


def test_no_module_re_exports_what_another_defines():
    """One import path per name: a name is imported from the module that defines it (an import
    that nothing uses is ruff's F401)."""
    found = {str(p.relative_to(SRC)): names for p in sorted(SRC.rglob("*.py"))
             if (names := re_exports(p))}
    assert found == {}


def test_the_re_export_check_sees_both_kinds(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "old.py").write_text(
        "from pkg.new import moved, used\nfrom pkg.other import kept as kept\n"
        "__all__ = ['moved', 'mine']\ndef mine():\n    return used\n")
    (tmp_path / "pkg" / "__init__.py").write_text(
        "from pkg.new import moved\n__all__ = ['moved']\n")
    assert re_exports(tmp_path / "pkg" / "old.py") == ["kept as kept",
                                                       "__all__ lists moved"]
    assert re_exports(tmp_path / "pkg" / "__init__.py") == []

