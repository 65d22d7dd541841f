"""What a user of ``dyntrain run`` sees: real launcher and worker processes, real signals."""

import json
import os
import re
import shlex
import subprocess

import pytest

from conftest import DYNTRAIN, ROOT, SCRIPTS, OutputLines, run_cli
from dyntrain.elastic.config import TrainConfig
from dyntrain.launch.events import parse_events
from dyntrain.testing.wait import wait_until


@pytest.mark.slow
def test_failing_script_keeps_tracebacks_and_reports_unfired_events(tmp_path):
    """Every worker raises in loss_fn: each log holds its full traceback and the job's last
    line points to it; an event the run never reached is named at the end (and in
    result.json)."""
    out = tmp_path / "run"
    proc = run_cli(["run", "--workers", "1:2", "--nproc", "2", "--out", out, "--events",
                    "step=10000:kill=1", SCRIPTS / "ledger_train.py", "--raise-in", "all",
                    "--raise-after", "30"])
    assert proc.returncode == 1, proc.stdout
    lines = proc.stdout.strip().splitlines()
    for worker in ("w0", "w1"):
        log = (out / "logs" / f"worker-{worker}.log").read_text()
        assert "Traceback (most recent call last)" in log, log
        assert 'raise RuntimeError("simulated device failure")' in log
        assert log.strip().endswith("RuntimeError: simulated device failure")
    failed = next(line for line in lines if "job failed" in line)
    culprit = failed.split("last error: ")[1].split(":")[0]
    assert (f"RuntimeError: simulated device failure; its traceback: "
            f"{out / 'logs' / f'worker-{culprit}.log'}") in failed
    assert "1 event(s) never fired: step=10000:kill=1 (the job ended at step" in lines[-1]
    assert lines[-1].endswith(", before step 10000; a longer run lets them fire)"), lines[-1]
    assert json.loads((out / "result.json").read_text()) == {
        "events_not_fired": ["step=10000:kill=1"]}


def test_readme_events_example_runs_long_enough_for_its_events():
    """The README's `dyntrain run --events` job must outlast its events on a loaded machine:
    the two joiners may take 10 s to start, while the job goes on at up to ~30 steps/s."""
    from dyntrain.workloads.digits import build_parser, load_digits_split

    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(dyntrain run [^`]*--events[^`]*)```", readme).group(1)
    argv = shlex.split(block.replace("\\\n", " "))
    events = parse_events(argv[argv.index("--events") + 1])
    args = build_parser().parse_args(argv[argv.index("-m") + 2:])
    total = TrainConfig(args.global_batch, args.chunk_size, epochs=args.epochs).total_steps(
        len(load_digits_split()[0]))
    last = max(e.at for e in events if e.trigger == "step")
    assert total >= last + 10 * 30 + 100, (total, last)


def _launch(out, *args):
    """`dyntrain run` in its own session (as from a terminal), reading its output lines."""
    import subprocess

    from conftest import DYNTRAIN

    return subprocess.Popen([*DYNTRAIN, "run", "--workers", "2", "--out", str(out), *args,
                             str(SCRIPTS / "ledger_train.py"), "--epochs", "40",
                             "--step-delay", "0.003"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            start_new_session=True)


def _interrupt_when(launcher, seen) -> tuple[list[str], str, list[int]]:
    """Send SIGINT to the launcher's process group once a line satisfies ``seen``; returns its
    lines before, the rest of its output and its workers' pids."""
    import os
    import signal

    before = []
    for line in launcher.stdout:
        before.append(line)
        if seen(line):
            break
    os.killpg(launcher.pid, signal.SIGINT)
    rest = launcher.communicate(timeout=120)[0]
    pids = [int(m) for m in re.findall(r"wants to join|pid (\d+)\)", "".join(before)) if m]
    return before, rest, pids


@pytest.mark.slow
def test_ctrl_c_stops_every_worker_and_the_same_command_resumes(tmp_path):
    """Ctrl-C: the workers finish their step, the leader checkpoints it, every worker process is
    gone and the launcher says how to resume (exit 130); workers that do not stop (one hung,
    its peer blocked in the all-reduce) are killed after --grace-seconds. Re-running resumes
    each time, and the finished run applied every global batch exactly once."""
    import os

    from conftest import read_jsonl
    from test_elastic_e2e import assert_exactly_once

    out = tmp_path / "run"
    step = re.compile(r"step +(\d+)/")

    # 1. forced: rank 1 hangs (SIGSTOP); nothing stops within the grace period
    launcher = _launch(out, "--failure-timeout", "600", "--grace-seconds", "1",
                       "--events", "step=12:hang=rank:1")
    _, rest, pids = _interrupt_when(launcher, lambda line: "SIGSTOP to" in line)
    assert launcher.returncode == 130, rest
    last = rest.strip().splitlines()[-1]
    assert "0 worker(s) stopped, 2 killed (still running after 1 s)" in last, rest
    assert "run the same command again to resume" in last and "Traceback" not in rest

    # 2. graceful: the same command resumes (without firing the hang again); Ctrl-C once it
    # trained a few steps
    launcher = _launch(out, "--failure-timeout", "600", "--events", "step=12:hang=rank:1")
    _, rest, pids = _interrupt_when(
        launcher, lambda line: (m := step.search(line)) is not None and int(m.group(1)) >= 25)
    assert launcher.returncode == 130, rest
    stopped = re.search(r"interrupted at step (\d+): 2 worker\(s\) stopped; the newest "
                            r"checkpoint is at step (\d+): run the same command again to "
                            r"resume", rest)
    assert stopped, rest
    stopped = int(stopped.group(1))
    assert read_jsonl(out / "metrics.jsonl")[-1]["step"] == stopped  # metrics up to the stop
    assert f"ckpt-{stopped:09d}.dtck" in os.listdir(out / "checkpoints")
    assert len(pids) == 2
    for pid in pids:  # every worker of the run is gone
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

    # 3. the same command again finishes; nothing was applied twice or lost
    launcher = _launch(out, "--failure-timeout", "600", "--events", "step=12:hang=rank:1")
    rest = launcher.communicate(timeout=240)[0]
    assert launcher.returncode == 0, rest
    assert f"from step {stopped} (checkpoint" in rest
    assert_exactly_once(out)


def _readme_training_script() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Use it in your own training script"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
def test_readme_training_script_alone_shows_progress_writes_outputs_and_repeats(tmp_path):
    """The README's snippet as a real script, run plainly with `python my_train.py` twice
    into two output folders (DYNTRAIN_OUT): progress and the report on the terminal, the run
    folder's files written, and bitwise the same model both times (the seeded init)."""
    import os
    import subprocess
    import sys

    import torch

    from conftest import read_jsonl

    script = tmp_path / "my_train.py"
    script.write_text(_readme_training_script())
    finals, procs = [], {}
    for name in ("a", "b"):  # both at once: neither can see the other's folder
        env = {**os.environ, "DYNTRAIN_OUT": str(tmp_path / name), "OMP_NUM_THREADS": "1"}
        procs[name] = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    try:
        said = {name: proc.communicate(timeout=240) for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for name, proc in procs.items():
        stdout, stderr = said[name]
        proc = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert re.fullmatch(r"step +160/160 +epoch +9 +world 1 +loss \S+ +\S+ samples/s",
                            lines[-3]), proc.stdout
        assert lines[-2] == f"trained to step 160; model in {tmp_path / name / 'final.pt'}"
        assert re.fullmatch(r"result: train_accuracy=0\.9\d*", lines[-1]), proc.stdout
        out = tmp_path / name
        assert json.loads((out / "result.json").read_text()).keys() == {"train_accuracy"}
        assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == list(range(1, 161))
        assert sorted(p.name for p in (out / "checkpoints").iterdir())[-1] == "ckpt-000000160.dtck"
        finals.append(torch.load(out / "final.pt", weights_only=True))
    assert finals[0].keys() == finals[1].keys()
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])


@pytest.fixture(scope="module")
def two_worker_runs(tmp_path_factory):
    """Two short runs of two local workers (``dyntrain run --workers 2``, the ledger for 12
    steps, reporting its threads) under a shell whose OMP_NUM_THREADS is 2: one with the
    default threads, one with ``--threads 2``; their folders and outputs by name."""
    base = tmp_path_factory.mktemp("two-workers")
    runs = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "2")  # the shell does not decide the bits
        for name, threads in (("one", ()), ("two", ("--threads", "2"))):
            runs[name] = (base / name, run_cli(
                ["run", "--workers", "2", *threads, "--out", base / name,
                 SCRIPTS / "ledger_train.py", "--epochs", "2", "--report-threads"], check=True))
    return runs


@pytest.mark.slow
def test_run_ends_with_the_last_step_then_the_result(two_worker_runs):
    """The last step's progress line, then that the job finished, then the result: never the
    result before the last step's line (the once-a-second rhythm catches up first)."""
    for _, proc in two_worker_runs.values():
        lines = [line.split("] ", 1)[1] for line in proc.stdout.strip().splitlines()]
        assert re.fullmatch(r"step +12/12 +epoch +1 +world 2 +loss .*", lines[-3]), proc.stdout
        assert lines[-2] == "job finished at step 12", proc.stdout
        assert re.fullmatch(r"result: steps=12\W+threads=[12]", lines[-1]), proc.stdout


def test_local_workers_run_the_jobs_threads_whatever_the_cores_or_the_shell(two_worker_runs):
    """Every local worker runs the job's pinned intra-op threads: 1 by default whatever the
    machine's cores, --workers or the shell's OMP_NUM_THREADS; --threads chooses, is recorded,
    and the launcher says what many threads per core cost (time, not bits)."""
    one, proc = two_worker_runs["one"]
    assert "numerics of each worker, whatever its host: threads 1," in proc.stdout, proc.stdout
    assert json.loads((one / "result.json").read_text())["threads"] == 1
    assert json.loads((one / "numerics.json").read_text())["pinned"]["threads"] == 1

    two, proc = two_worker_runs["two"]
    assert "numerics of each worker, whatever its host: threads 2," in proc.stdout, proc.stdout
    cores = len(os.sched_getaffinity(0))
    shared = f"up to 2 local worker(s) x 2 thread(s) share {cores} core(s): slower, the same bits"
    assert (shared in proc.stdout) == (cores < 4), proc.stdout
    assert json.loads((two / "result.json").read_text())["threads"] == 2
    assert json.loads((two / "numerics.json").read_text())["pinned"]["threads"] == 2


@pytest.mark.slow
def test_run_without_local_workers_waits_for_the_printed_worker_command(tmp_path):
    """`--nproc 0`: the job waits (even with --quiet it says so, with the `dyntrain worker`
    command to run); the worker started with that command trains the job to the end."""
    import subprocess

    from conftest import DYNTRAIN

    launcher = subprocess.Popen(
        [*DYNTRAIN, "run", "--workers", "1:2", "--nproc", "0", "--quiet", "--out",
         str(tmp_path / "run"), str(SCRIPTS / "ledger_train.py"), "--epochs", "5"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    worker = None
    try:
        said = launcher.stdout.readline()
        assert "no local workers (--nproc 0): the job waits for workers to join; start each " \
               "with: dyntrain worker --coordinator 127.0.0.1:" in said, said
        command = said.split("start each with: ")[1].split(" (it listens on 127.0.0.1")[0]
        assert command.endswith(f"{SCRIPTS / 'ledger_train.py'} --epochs 5"), said
        worker = subprocess.Popen([*DYNTRAIN, *shlex.split(command)[1:]], cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        rest = launcher.communicate(timeout=240)[0]
        assert launcher.returncode == 0, rest
        assert worker.wait(timeout=60) == 0, worker.stdout.read()
        assert "every worker is gone" not in rest
        assert (tmp_path / "run" / "final.pt").is_file()
    finally:
        for proc in (launcher, worker):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def test_standby_workers_take_a_lost_members_place_and_are_kept_ready(tmp_path):
    """--standby 1: a worker beyond the full world waits with its script at fit(); it takes a
    killed member's place in the same re-formation (the world stays 2), its join counted from
    the kill, and the launcher starts another to wait."""
    hold = tmp_path / "hold"
    # no step until the standby is there, so the kill at step 4 finds it waiting (a slowdown
    # alone let a loaded machine reach step 4 before the standby said hello)
    hold.touch()
    launcher = subprocess.Popen(
        [*DYNTRAIN, "run", "--workers", "1:2", "--nproc", "2", "--standby", "1", "--events",
         "step=4:kill=rank:1", "--out", str(tmp_path / "run"), str(SCRIPTS / "ledger_train.py"),
         "--epochs", "4", "--hold-while", str(hold)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    lines = OutputLines(launcher)
    try:
        wait_until(lambda: sum("wants to join" in x for x in lines.lines) >= 3,
                   "the two members and the standby to say hello", 120)
        hold.unlink()
        assert launcher.wait(timeout=240) == 0, "\n".join(lines.lines)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    out = "\n".join(lines.lines)
    assert "standby: started" in out, out
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").open()]
    crash = next(e for e in events if e["event"] == "crash")
    join = next(e for e in events
                if e["event"] == "join" and e["generation"] == crash["generation"])
    assert join["world_after"] == 2 and join["latency_s"] < 30, events
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert all(m["world_size"] == 2 for m in metrics), "the standby took the lost place"
    bad = run_cli(["run", "--workers", "1:2", "--standby", "3", "--out", tmp_path / "bad",
                   SCRIPTS / "ledger_train.py"])
    assert bad.returncode == 2 and bad.stderr.strip().endswith(
        "--standby must be between 0 and --workers MAX (2), got 3"), bad.stderr
