"""``/proc/PID/stat`` parsed in one place: real processes, names with spaces and parentheses,
processes that are gone."""

import os
import signal
import subprocess
import sys

from dyntrain.procstat import (
    CLOCK_TICKS,
    ProcState,
    all_pids,
    machine_busy_seconds,
    parse_stat,
    read_stat,
)
from dyntrain.testing.wait import wait_until

# a child that names itself (at most 15 bytes) and waits for its stdin to close
NAMED = ("import sys; open('/proc/self/comm', 'w').write(sys.argv[1]); print('named', flush=True);"
         " sys.stdin.read()")


def named_child(name: str, **popen) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", NAMED, name], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, **popen)
    assert proc.stdout.readline() == "named\n"
    return proc


def end(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    proc.wait(timeout=30)


def test_a_name_with_spaces_and_parentheses_does_not_shift_the_fields():
    proc = named_child(") (x) 1 2 (")
    try:
        stat = read_stat(proc.pid)
        assert stat is not None
        assert stat.pid == proc.pid and stat.comm == ") (x) 1 2 ("
        assert stat.ppid == os.getpid()
        assert stat.state in (ProcState.SLEEPING, ProcState.RUNNING)  # reading its stdin
        assert stat.start_ticks == read_stat(proc.pid).start_ticks  # names this process
        assert stat.start_ticks >= read_stat(os.getpid()).start_ticks  # started after us
        assert proc.pid in all_pids()
    finally:
        end(proc)


def test_session_group_and_cpu_time_of_a_real_process():
    proc = named_child("leader x", start_new_session=True)
    try:
        stat = read_stat(proc.pid)
        assert stat.session == proc.pid and stat.pgrp == proc.pid  # it leads its own session
        assert read_stat(os.getpid()).session != proc.pid
        assert stat.cpu_seconds == (stat.utime_ticks + stat.stime_ticks) / CLOCK_TICKS
    finally:
        end(proc)


def test_stopped_zombie_and_gone():
    proc = named_child("stop me")
    os.kill(proc.pid, signal.SIGSTOP)
    wait_until(lambda: read_stat(proc.pid).state.stopped, "the child to stop", 30)
    os.kill(proc.pid, signal.SIGKILL)
    # not reaped yet: a zombie that has ended
    wait_until(lambda: read_stat(proc.pid).state.ended, "the child to become a zombie", 30)
    assert read_stat(proc.pid).state is ProcState.ZOMBIE
    proc.wait(timeout=30)
    assert read_stat(proc.pid) is None  # reaped: no such process
    assert read_stat(2**22 + 12345) is None  # above any pid Linux hands out


def test_parse_stat_counts_fields_from_the_last_parenthesis():
    fields = ["S", "1", "7", "7"] + ["0"] * 7 + ["13", "4"] + ["0"] * 6 + ["987654", "0"]
    line = "4242 (a) (b) c) " + " ".join(fields) + "\n"
    stat = parse_stat(line.encode())
    assert (stat.pid, stat.comm, stat.state, stat.ppid, stat.pgrp, stat.session) == \
        (4242, "a) (b) c", ProcState.SLEEPING, 1, 7, 7)
    assert (stat.utime_ticks, stat.stime_ticks, stat.start_ticks) == (13, 4, 987654)
    assert parse_stat("") is None
    assert parse_stat("4242 (cut short) S 1 7") is None  # a line that ended while being read
    assert parse_stat(line.replace(" S ", " ? ")) is None  # not a state


def test_machine_busy_seconds_grow():
    before = machine_busy_seconds()
    assert before is not None and before > 0
    end(named_child("busy"))  # a Python start-up: some CPU time somewhere
    wait_until(lambda: machine_busy_seconds() > before, "the machine's busy time to grow", 30)


def test_reading_it_imports_neither_torch_nor_numpy():
    """The service's worker supervisor (standard library only) may use it."""
    code = ("import sys, dyntrain.procstat; print(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('torch', 'numpy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == "[]"
