"""What a user of ``dyntrain run`` sees: real launcher and worker processes, real signals."""

import json
import re
import shlex

import pytest

from conftest import ROOT, SCRIPTS, run_cli
from dyntrain.elastic.config import TrainConfig
from dyntrain.launch.events import parse_events


@pytest.mark.slow
def test_failing_script_keeps_tracebacks_and_reports_standby_and_unfired_events(tmp_path):
    """Every worker raises in loss_fn: each log holds its full traceback and the job's last
    line points to it; a worker beyond MAX is said to wait on standby; an event the run never
    reached is named at the end (and in result.json)."""
    out = tmp_path / "run"
    proc = run_cli(["run", "--workers", "1:1", "--nproc", "2", "--out", out, "--events",
                    "step=10000:kill=1", SCRIPTS / "ledger_train.py", "--raise-in", "all",
                    "--raise-after", "30"])
    assert proc.returncode == 1, proc.stdout
    lines = proc.stdout.strip().splitlines()
    assert "1 of the 2 workers wait on standby (--workers 1:1 admits at most 1)" in lines[1]
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
