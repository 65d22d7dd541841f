"""The test suite's own rules: a test waits on a condition, through the one helper
(``dyntrain.testing.wait.wait_until``), never by sleeping a fixed time or by a deadline loop of
its own. Code that a test runs as a job (``tests/scripts/``, or the strings of ``python -c``) is
the behaviour under test, and may sleep."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CLOCKS = {"monotonic", "time", "perf_counter"}

# functions that may loop on the clock, with why
ALLOWED = {
    # steps a Controller and pauses as the service's loop does (executor.wait, ended early by a
    # worker's exit): the step is the work, the pause is the service's, not a poll's
    ("service/test_controller.py", "drive"),
}


def _is_call(node: ast.AST, names: set[str]) -> bool:
    """``time.NAME(...)`` or a bare ``NAME(...)`` for a NAME in ``names``."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr in names and isinstance(func.value, ast.Name) and func.value.id == "time"
    return isinstance(func, ast.Name) and func.id in names


def waits_of_its_own(source: str) -> list[tuple[int, str, str]]:
    """(line, enclosing function, what) for each ``time.sleep`` call and each loop that
    compares the clock with something (``while time.monotonic() < deadline``, ``assert
    time.monotonic() < deadline`` inside a loop) in ``source``. A loop that times what it does
    (``took.append(time.perf_counter() - t)``) is no wait."""
    found = []

    def reads_clock(node: ast.AST) -> bool:
        return any(_is_call(n, CLOCKS) for n in ast.walk(node))

    def visit(node: ast.AST, function: str, loop: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function, loop = node.name, False
        if _is_call(node, {"sleep"}):
            found.append((node.lineno, function, "a fixed sleep"))
        if isinstance(node, (ast.While, ast.For)):
            if isinstance(node, ast.While) and reads_clock(node.test):
                found.append((node.lineno, function, "a deadline loop"))
            loop = True
        elif loop and isinstance(node, ast.Compare) and reads_clock(node) and \
                (node.lineno, function, "a deadline loop") not in found:
            found.append((node.lineno, function, "a deadline loop"))
        for child in ast.iter_child_nodes(node):
            visit(child, function, loop)

    visit(ast.parse(source), "<module>", False)
    return found


def test_tests_wait_on_conditions_through_the_one_helper():
    offences = []
    for path in sorted(TESTS.rglob("*.py")):
        name = path.relative_to(TESTS).as_posix()
        if name.startswith("scripts/"):
            continue
        offences += [f"{name}:{line} ({function}): {what}"
                     for line, function, what in waits_of_its_own(path.read_text())
                     if (name, function) not in ALLOWED]
    assert not offences, ("wait with dyntrain.testing.wait.wait_until instead:\n"
                          + "\n".join(offences))


def test_the_check_sees_sleeps_and_deadline_loops_but_not_a_jobs_code():
    source = '''
import time
from time import sleep

JOB = "import time; time.sleep(60)"  # a job's code: the behaviour under test

def test_sleeps():
    time.sleep(0.5)

def test_bare_sleep():
    sleep(1)

def _wait(cond):
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline

def _poll(cond):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not cond():
        pass

def test_timed():
    started = time.monotonic()
    assert time.monotonic() - started < 10
    took = []
    for _ in range(3):
        t = time.perf_counter()
        took.append(time.perf_counter() - t)
'''
    assert waits_of_its_own(source) == [(8, "test_sleeps", "a fixed sleep"),
                                        (11, "test_bare_sleep", "a fixed sleep"),
                                        (16, "_wait", "a deadline loop"),
                                        (20, "_poll", "a deadline loop")]
