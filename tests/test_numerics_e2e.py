"""One result whatever machine a worker lands on, end to end: the job pins its numerics in every
worker (threads, kernel level), and a worker that cannot match is refused with its reason while
the job goes on.

Hosts differ as spot fleets do: network-namespace hosts (``dyntrain.testing.hosts``) with fewer
cores (CPU affinity), a shell that sets another thread count and kernel level, and a CPU that
lacks the job's instruction set (its ``/proc/cpuinfo``).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conftest import SCRIPTS, read_jsonl, run_cli
from dyntrain.errors import EXIT_USAGE
from dyntrain.testing.jobs import CLI, HostJob, Output, clean_env
from dyntrain.testing.wait import wait_until
from test_elastic_e2e import max_param_diff, world_sizes

pytestmark = pytest.mark.slow
HOSTS = 4
IMAGE = SCRIPTS / "image_train.py"
DIGITS = ["-m", "dyntrain.workloads.digits", "--global-batch", "32", "--chunk-size", "4",
          "--epochs", "2"]


def _bitwise(a, b) -> None:
    x = torch.load(a / "final.pt", weights_only=True)
    y = torch.load(b / "final.pt", weights_only=True)
    assert x.keys() == y.keys()
    differ = [k for k in x if not torch.equal(x[k], y[k])]
    assert not differ, f"{len(differ)} tensors differ, e.g. {differ[0]}"


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_one_worker_and_an_elastic_run_compute_the_same_bits(tmp_path, precision):
    """``--workers 1`` against ``--workers 1:4`` with a join, a kill and a leave, loader
    processes, augmentation and autocast: the launcher's flags never choose the bits (it used
    to give each worker cores / MAX threads, so that these two runs differed in bf16)."""
    static, elastic = tmp_path / "static", tmp_path / "elastic"
    script = [IMAGE, "--precision", precision, "--steps", "40"]
    gate = tmp_path / "hold"  # held slow until the three changes took effect
    gate.touch()
    launcher = Output(subprocess.Popen(
        [*CLI, "run", "--workers", "1:4", "--nproc", "1", "--out", elastic, "--events",
         "step=3:join=2,step=6:kill=1,step=9:leave=rank:0", *script, "--hold", gate],
        env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    run_cli(["run", "--workers", "1", "--quiet", "--out", static, *script], check=True)
    wait_until(lambda: launcher.proc.poll() is not None or (
        (elastic / "events.jsonl").exists()
        and "leave" in [e["event"] for e in read_jsonl(elastic / "events.jsonl")]),
        "the leave taking effect", timeout=300)
    gate.unlink()
    assert launcher.wait(240) == 0, launcher.text()[-3000:]
    assert world_sizes(elastic)[:4] == [1, 3, 2, 1], launcher.text()[-3000:]
    _bitwise(static, elastic)
    for run in (static, elastic):
        record = json.loads((run / "numerics.json").read_text())
        assert record["pinned"]["threads"] == 1 and record["settings"]["threads"] == 1
        assert record["bitwise_until"] is None


def test_workers_on_unlike_hosts_train_the_static_model_and_a_mismatch_is_refused(
        hosts, tmp_path):
    """An fp32 digits job on host 0. Host 1 has one core and a shell that asks for two threads
    and the kernels of an older CPU: its worker runs the job's numerics anyway and the model is
    the static run's. Host 2's CPU lacks the job's instruction set: its worker is refused before
    its script starts. A worker started by hand with another kernel level is caught by its
    canary. The job goes on without them."""
    static = tmp_path / "static"
    run_cli(["run", "--workers", "1", "--quiet", "--out", static, *DIGITS], check=True)
    gate = hosts.shared / "digits.hold"  # held slow until the test saw every worker's fate
    gate.touch()
    job = HostJob(hosts.host(0), hosts.shared / "digits",
                  [SCRIPTS / "digits_held.py", gate, *DIGITS[2:]],
                  ["--workers", "1:4", "--nproc", "1"])
    hosts.limit_cpus(1, (0,))
    hosts.hide_cpu_flags(2, ("avx2",))
    one_core = job.add_worker(hosts.host(1), env={"OMP_NUM_THREADS": "2",
                                                  "ATEN_CPU_CAPABILITY": "default"})
    old_cpu = job.add_worker(hosts.host(2))
    by_hand = Output(hosts.host(3).popen(
        [sys.executable, SCRIPTS / "digits_held.py", gate, *DIGITS[2:]], env=clean_env(
            DYNTRAIN_COORDINATOR=job.coordinator, DYNTRAIN_WORKER_ID="by-hand",
            ATEN_CPU_CAPABILITY="default"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True))
    assert old_cpu.wait(180) == EXIT_USAGE, old_cpu.text()[-2000:]
    said = old_cpu.text()
    assert "this worker cannot join the job: this host (host2)'s CPU lacks avx2: it cannot run " \
           "the job's cpu kernels avx2 (it runs at most default); start the job with " \
           "--cpu-kernels default" in said, said[-2000:]
    assert "Traceback" not in said
    assert by_hand.wait(180) == EXIT_USAGE, by_hand.text()[-2000:]
    caught = by_hand.text()
    assert "by-hand on host3 computes other bits than the job: canary " in caught, caught[-2000:]
    assert "cpu_capability DEFAULT (pinned: AVX2)" in caught
    wait_until(lambda: job.world() == 2, "host 1's worker training beside host 0's", timeout=240)
    gate.unlink()
    assert job.wait(300) == 0, job.launcher.text()[-3000:]
    assert one_core.wait(60) == 0, one_core.text()[-2000:]
    assert "rejected worker by-hand: by-hand on host3 computes other bits" in job.launcher.text()
    assert max_param_diff(static, job.out) == 0.0
    record = json.loads((job.out / "numerics.json").read_text())
    assert record["bitwise_until"] is None and record["settings"]["threads"] == 1


def test_mixed_numerics_allowed_are_admitted_and_recorded(tmp_path):
    """With --allow-mixed-numerics a worker of another kernel level trains, and the run folder
    and the launcher say from which step the run is no longer bitwise."""
    out, gate = tmp_path / "run", tmp_path / "hold"
    gate.touch()  # held slow until the other worker trained beside the first, then 30 steps end
    script = [SCRIPTS / "digits_held.py", gate, *DIGITS[2:], "--max-steps", "30"]
    launcher = Output(subprocess.Popen(
        [*CLI, "run", "--workers", "1:2", "--nproc", "1", "--allow-mixed-numerics", "--out",
         out, *script], env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True))
    other = None
    try:
        address = wait_until(lambda: launcher.find(r"--coordinator (\S+)"), "the join command")[1]
        wait_until(lambda: (out / "numerics.json").exists(), "the job's numerics recorded")
        # started by hand, not by `dyntrain worker` (which would pin it): another kernel level
        other = Output(subprocess.Popen(
            [sys.executable, *script], env=clean_env(ATEN_CPU_CAPABILITY="default",
                                                     DYNTRAIN_COORDINATOR=address),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        wait_until(lambda: other.proc.poll() is not None or launcher.proc.poll() is not None
                   or (out / "metrics.jsonl").exists() and world_sizes(out)[-1:] == [2],
                   "the other worker training", timeout=240)
        gate.unlink()
        assert other.wait(300) == 0, other.text()[-3000:]
        assert launcher.wait(300) == 0, launcher.text()[-3000:]
    finally:
        for proc in (launcher, other):
            if proc is not None and proc.proc.poll() is None:
                proc.proc.kill()
                proc.proc.wait()
    assert 2 in world_sizes(out), launcher.text()[-3000:]
    record = json.loads((out / "numerics.json").read_text())
    assert record["bitwise_until"] is not None and record["mixed"][0]["differs"]
    assert "not bitwise: " in launcher.text() and "computed other bits from step" in \
        launcher.text()
