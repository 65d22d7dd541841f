"""The documentation: the site builds without a warning, what it names exists, it is current.

The site is MkDocs (``mkdocs.yml``): ``mkdocs build --strict`` fails on a broken link or anchor,
a page left out of the navigation and a docstring the API reference cannot read. The README's
snippets are run by ``tests/test_run_usability.py``.
"""

import importlib
import inspect
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

PAGES = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")])
SOURCE_DIRS = ("src", "tests", "bench", "tools", "examples")
TOP = ("src/", "tests/", "bench/", "docs/", "examples/", "tools/", "Makefile", "pyproject.toml",
       "mkdocs.yml", "README.md", "CHANGELOG.md")
# files the docs name that are the user's own, not the repository's
USER_FILES = {"my_train.py", "my_workload.py", "shard.py", "train.py", "file.py", "script.py"}
CODE = re.compile(r"`([^`\n]+)`")
SRC_PATH = re.compile(r"\bsrc/dyntrain/[\w/.]*\w")


# `make docs` installs the `docs` extra alone: the site is built without dyntrain, torch and
# the other extras importable
WITHOUT = ("dyntrain", "torch", "numpy", "fastapi", "sqlalchemy", "matplotlib", "sklearn")
MKDOCS_ALONE = (f"import runpy, sys; sys.modules.update(dict.fromkeys({WITHOUT!r})); "
                "sys.argv[0] = 'mkdocs'; runpy.run_module('mkdocs', run_name='__main__')")


def test_the_site_builds_without_a_warning(tmp_path):
    """Strict: a broken link or anchor, a page outside the navigation, or an unreadable
    docstring fails the build; nothing is fetched (the theme's fonts are off). Built as `make
    docs` builds it: with MkDocs and its plugins only (the API reference is read from src/)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-c", MKDOCS_ALONE, "build", "--strict",
                           "--site-dir", str(tmp_path / "site")], cwd=ROOT, capture_output=True,
                          text=True, env=env, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "WARNING" not in output, output
    site = tmp_path / "site"
    assert (site / "index.html").is_file() and (site / "changelog.html").is_file()
    trainer = (site / "reference" / "trainer.html").read_text()
    assert "collective_timeout" in trainer and "global_batch" in trainer  # Args rendered
    for page in site.rglob("*.html"):
        text = page.read_text()
        assert "fonts.googleapis.com" not in text and "fonts.gstatic.com" not in text, page


def _named_paths(text: str) -> list[str]:
    """Repository paths a page names: in code spans, and ``src/dyntrain/...`` anywhere."""
    found = SRC_PATH.findall(text)
    for span in CODE.findall(text):
        token = span.split("::")[0].strip()
        if " " in token or "://" in token or not re.fullmatch(r"[\w.*/-]+", token):
            continue
        if token.startswith(TOP) or (token.endswith(".py") and token not in USER_FILES):
            found.append(token)
    return list(dict.fromkeys(found))


def _exists(token: str) -> bool:
    if token.startswith(TOP):
        return any(ROOT.glob(token)) if "*" in token else (ROOT / token).exists()
    # a module named by its file, or by its package-relative path (``executors/ray.py``)
    return any(path.as_posix().endswith("/" + token)
               for folder in SOURCE_DIRS for path in (ROOT / folder).rglob(token.split("/")[-1]))


def test_every_repository_path_the_docs_name_exists():
    missing = [f"{page.relative_to(ROOT)}: {token}" for page in PAGES
               for token in _named_paths(page.read_text()) if not _exists(token)]
    assert missing == []


def test_the_path_check_sees_a_missing_file():
    text = ("see `src/dyntrain/elastic/nothing.py`, `executors/ray.py`, `shard.py`, "
            "`tests/test_docs.py::test_x`, `runs/digits` and src/dyntrain/gone/")
    assert sorted(t for t in _named_paths(text) if not _exists(t)) == [
        "src/dyntrain/elastic/nothing.py", "src/dyntrain/gone"]


def test_relative_links_point_at_files_in_the_repository():
    """As GitHub shows the pages: every relative link's file exists (the site build checks
    the anchors, through tools/mkdocs_hooks.py's mapping of the same links)."""
    link = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")
    broken = [f"{page.relative_to(ROOT)}: {target}" for page in PAGES
              for target in link.findall(page.read_text())
              if "://" not in target and not target.startswith("mailto:")
              and not (page.parent / target).exists()]
    assert broken == []


def test_benchmark_reports_match_the_results():
    """docs/benchmarks/*.md are what bench/report.py makes of bench/results/ (regenerated and
    compared: run `make bench-report` after adding a result)."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "report.py"), "--check"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# how the project was made, not what it is: a page, comment or docstring states the fact ("one
# H200; not run on several GPUs yet"), not the story of a run, a machine lent, an issue's number
ABOUT_THE_WORK = [re.compile(pattern, re.I) for pattern in (
    r"\bissues? #?\d+", r"\b(a|the) lent\b", r"\blent (NVIDIA|H200|GPU|machine)",
    r"\bdevice time\b", r"\bour\b[^.\n]{0,30}\bgoal", r"\bfresh[- ]clones?\b",
    r"\bruns? saw\b", r"\bseen (once|twice)( at| in|:)", r"\bflakes?\b",
    r"\bmeasured on this machine\b", r"\bthis machine's shell\b",
    r"\bnoise of this machine\b", r"\bthe (last|previous) submission\b",
    r"\bwas lent to\b", r"\bthis task\b", r"\bthe issue\b", r"\bother (engineers|helpers)\b",
    r"\bthe seeds'")]


def about_the_work(text: str) -> list[str]:
    """What ``text`` says about how the project was made (the matches of ABOUT_THE_WORK)."""
    return [m.group(0) for pattern in ABOUT_THE_WORK for m in pattern.finditer(text)]


def test_the_docs_name_no_file_outside_the_repository_and_speak_about_the_product():
    outside = ("SEEDS.md", "DESIGN.md")
    files = [p for folder in ("src", "tests", "bench", "tools", "examples", "docs")
             for p in (ROOT / folder).rglob("*") if p.is_file()
             and p.suffix in (".py", ".md", ".txt", ".json", ".html", ".yml", ".sh")]
    files += [ROOT / name for name in ("README.md", "CHANGELOG.md", "Makefile",
                                       "pyproject.toml", "mkdocs.yml")]
    files = [p for p in files if p != ROOT / "tests" / "test_docs.py"]
    named = [f"{p.relative_to(ROOT)}: {word}" for p in files for word in outside
             if word in p.read_text(errors="replace")]
    assert named == []
    wording = [f"{p.relative_to(ROOT)}: {phrase!r}" for p in files
               if "results" not in p.relative_to(ROOT).parts  # what a run printed, kept
               for phrase in about_the_work(p.read_text(errors="replace"))]
    assert wording == []


def test_the_wording_check_sees_how_the_project_was_made():
    assert about_the_work("On a lent NVIDIA H200 the tests pass (issue 21); the device time "
                          "ran out. A loaded fresh-clone run saw that (our goal: 0.98).") == [
        "issue 21", "a lent", "lent NVIDIA", "device time", "our goal", "fresh-clone", "run saw"]
    assert about_the_work("One H200; not run on several GPUs yet. Idle slots are lent to "
                          "training; the checkpoint is seen once that one record exists.") == []


def _documented_objects():
    """Every object the API reference renders (``::: dotted.name``), members included."""
    for page in sorted((ROOT / "docs" / "reference").glob("*.md")):
        for name in re.findall(r"^::: (\S+)", page.read_text(), re.M):
            try:
                module = importlib.import_module(name)
            except ModuleNotFoundError:
                module_name, _, attr = name.rpartition(".")
                yield name, getattr(importlib.import_module(module_name), attr)
            else:
                yield from ((f"{name}.{k}", v) for k, v in vars(module).items()
                            if not k.startswith("_") and getattr(v, "__module__", "") == name)


def _parameters(fn) -> list[str]:
    try:
        names = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return []
    return [n for n in names if n not in ("self", "cls")]


def _undocumented(name: str, obj) -> list[str]:
    """Public constructors and functions with parameters but no ``Args:`` section."""
    found = []
    if inspect.isclass(obj):
        own_init = "__init__" in vars(obj) or hasattr(obj, "__dataclass_fields__")
        if own_init and _parameters(obj) and "Args:" not in (obj.__doc__ or ""):
            found.append(name)
        for member, value in vars(obj).items():
            fn = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
            if (not member.startswith("_") and inspect.isfunction(fn) and _parameters(fn)
                    and "Args:" not in (fn.__doc__ or "")):
                found.append(f"{name}.{member}")
    elif inspect.isfunction(obj) and _parameters(obj) and "Args:" not in (obj.__doc__ or ""):
        found.append(name)
    return found


def test_the_public_api_documents_its_arguments():
    """An ``Args:`` section (Google style, rendered by the API reference) on every public
    constructor, method and function that takes arguments."""
    pytest.importorskip("httpx")  # the service client's module needs it (the service extra)
    objects = list(_documented_objects())
    assert any(name.endswith("ElasticTrainer") for name, _ in objects)
    assert [n for name, obj in objects for n in _undocumented(name, obj)] == []


CONFLICT = re.compile(r"^(<{7}|>{7}) ", re.MULTILINE)  # a merge's conflict markers


def test_no_file_keeps_a_merge_conflict():
    """A committed conflict (CHANGELOG.md kept one for a stop) is caught here, not by a reader."""
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "Makefile", ROOT / "mkdocs.yml",
             ROOT / "pyproject.toml",
             *(path for folder in ("docs", "src", "tests", "bench", "examples", "tools")
               for path in (ROOT / folder).rglob("*")
               if path.suffix in (".md", ".py", ".toml", ".yml", ".yaml", ".json", ".txt")
               and ".venv" not in path.parts)]
    kept = [str(path.relative_to(ROOT)) for path in files if path.is_file()
            and CONFLICT.search(path.read_text(errors="replace"))]
    assert not kept, f"merge conflict markers in {kept}"
    assert CONFLICT.search("text\n<<<<<<< HEAD\nours\n=======\ntheirs\n>>>>>>> branch\n")
