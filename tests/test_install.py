"""``pip install dyntrain`` without extras: the trainer, ``dyntrain run`` and ``compare`` work,
and every command that needs an extra says which one in one line (exit code 2).

The bare environment is a new virtual environment holding exactly what ``pip install dyntrain``
would install: dyntrain's requirements without extras and theirs, recursively, read from the
package metadata. Tests cannot download, so each of those distributions is linked in from this
environment, where it is installed (torch 2.13.0 among them); the extras stay out of sight.
"""

from __future__ import annotations

import os
import site
import subprocess
import venv
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from conftest import ROOT, SCRIPTS

pytestmark = pytest.mark.slow


def requirement_closure(name: str) -> list[metadata.Distribution]:
    """``name`` and every distribution its requirements without extras pull in, recursively,
    as installed here."""
    found: dict[str, metadata.Distribution] = {}
    todo: list[tuple[str, frozenset[str]]] = [(name, frozenset())]
    while todo:
        wanted, extras = todo.pop()
        # as installed in site-packages: never a source tree's egg-info that a test put on
        # sys.path (its files would be the sources, not what pip installed)
        dist = next(metadata.distributions(name=wanted, path=site.getsitepackages()))
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in found and not extras:
            continue
        found[key] = dist
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e})
                                         for e in (extras or {""})):
                todo.append((req.name, frozenset(req.extras)))
    return list(found.values())


def link_distribution(dist: metadata.Distribution, site: Path) -> None:
    """Make ``dist``'s top-level files and folders (packages, metadata, ``.pth``) appear in
    ``site``."""
    base = Path(dist.locate_file(""))
    for top in {Path(str(f)).parts[0] for f in dist.files or ()} - {"..", "__pycache__"}:
        target, link = base / top, site / top
        if target.exists() and not link.exists():
            link.symlink_to(target)


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> Path:
    """The bare environment's python."""
    root = tmp_path_factory.mktemp("bare-venv")
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    site = next(root.glob("lib/python*/site-packages"))
    for dist in requirement_closure("dyntrain"):
        link_distribution(dist, site)
    python = root / "bin" / "python"
    for module in ("sklearn", "fastapi", "sqlalchemy", "matplotlib", "PIL", "simplejpeg", "yaml",
                   "rich"):
        seen = subprocess.run([python, "-c", f"import {module}"], capture_output=True)
        assert seen.returncode != 0, f"the bare environment sees {module}"
    return python


def dyntrain(python: Path, *args, timeout: float = 240, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "DYNTRAIN_URL", "DYNTRAIN_OUT", "VIRTUAL_ENV")}
    return subprocess.run([python, "-m", "dyntrain.cli.main", *map(str, args)], cwd=kw.pop(
        "cwd", ROOT), capture_output=True, text=True, timeout=timeout, env=env, **kw)


def test_the_bare_install_runs_an_elastic_job_bitwise_equal_to_one_worker(bare, tmp_path,
                                                                          static_ledger):
    assert "run" in dyntrain(bare, "--help").stdout
    out = tmp_path / "run"
    proc = dyntrain(bare, "run", "--workers", "1:2", "--nproc", "1", "--events", "step=40:join=1",
                    "--out", out, SCRIPTS / "ledger_train.py", "--step-delay", "0.002")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "world 1 -> 2" in proc.stdout, proc.stdout[-3000:]
    same = dyntrain(bare, "compare", out, static_ledger)
    assert same.returncode == 0 and same.stdout.startswith("match: max |a-b| = 0"), same.stdout


@pytest.mark.parametrize("args, extra", [
    (("server", "--port", "0", "--state-dir", "{tmp}/state"), "service"),
    (("status",), "service"),
    (("submit", "--", "true"), "service"),
    (("ce", "list"), "service"),
    (("lab", "sweep", "--preset", "quick", "--service", "none", "--out", "{tmp}/sweep"), "lab"),
    (("run", "--tensorboard", "--out", "{tmp}/run", str(SCRIPTS / "ledger_train.py")),
     "tensorboard"),
])
def test_a_command_that_needs_an_extra_names_it(bare, tmp_path, args, extra):
    proc = dyntrain(bare, *(a.format(tmp=tmp_path) for a in args), timeout=120)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, (proc.stdout, err)
    assert err.startswith("dyntrain: error: ") and err.count("\n") == 0, err
    assert err.endswith(f"pip install 'dyntrain[{extra}]'"), err


def test_a_bundled_workload_without_its_extra_names_it(bare, tmp_path):
    proc = dyntrain(bare, "run", "--out", tmp_path / "run", "-m", "dyntrain.workloads.digits")
    assert proc.returncode == 2  # bad input: a missing extra
    last = proc.stdout.strip().splitlines()[-1]
    assert "job failed: no worker could start: digits: error: the digits workload needs " \
           "scikit-learn, which is not installed: pip install 'dyntrain[workloads]'" in last, last



def test_the_bare_install_trains_the_gpt_sharded(bare, tmp_path):
    """The GPT workload needs no extra, sharded too (refusing LARS once imported the recipes,
    and with them the image decoders of the ``data`` extra: a GPU machine without them failed)."""
    out = tmp_path / "run"
    proc = dyntrain(bare, "run", "--workers", "2:2", "--nproc", "2", "--out", out, "-m",
                    "dyntrain.workloads.gpt", "--model", "tiny", "--seq-len", "16",
                    "--global-batch", "4", "--chunk-size", "1", "--max-steps", "3",
                    "--val-samples", "4", "--shard", "3", "--shard-redundancy", "1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "final.pt").exists()
