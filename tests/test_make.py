"""What the Makefile's set-up targets install (``make -n``: the commands, none of them run)."""

import subprocess
import tomllib

from conftest import ROOT


def make_n(target: str, tmp_path) -> list[str]:
    """The commands ``make TARGET`` runs on a fresh machine (a ``.venv`` not created yet)."""
    # --no-print-directory: under `make test` this make is a sub-make, which would say
    # "make[1]: Entering directory ..." around its commands
    proc = subprocess.run(["make", "-n", "--no-print-directory", target,
                           f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True)
    return [line for line in proc.stdout.splitlines() if not line.startswith("#")]


def installs(commands: list[str]) -> list[str]:
    return [c for c in commands if "pip install" in c]


def test_make_docs_installs_only_the_docs_extra(tmp_path):
    """The site needs MkDocs and its plugins, not torch nor every extra."""
    commands = make_n("docs", tmp_path)
    (install,) = installs(commands)
    assert "torch" not in " ".join(commands) and "-e " not in install, commands
    # the requirements come from the docs extra: run the command that reads them
    inner = install.partition("$(")[2].rpartition(")")[0]
    read = subprocess.run(inner.replace(str(tmp_path / "venv" / "bin" / "python"), "python3"),
                          shell=True, cwd=ROOT, capture_output=True, text=True, check=True)
    docs = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["docs"]
    assert read.stdout.split() == docs
    assert all(d.startswith(("mkdocs", "mkdocstrings")) for d in docs), docs
    assert commands[-1].endswith("mkdocs build --strict --site-dir build/site")


def test_make_demo_installs_tensorboard(tmp_path):
    """Every run folder gets TensorBoard event files when tensorboard is installed
    (docs/tensorboard.md): the demo installs it, so its run folders have them."""
    (*_, demo) = installs(make_n("demo", tmp_path))
    extras = demo.rpartition('".[')[2].partition("]")[0].split(",")
    assert {"service", "workloads", "tensorboard"} <= set(extras), demo
