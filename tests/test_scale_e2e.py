"""The invariant at sixteen workers: real processes, real gloo, waves of joins and kills."""

import pytest
import torch

from conftest import read_jsonl, run_cli

pytestmark = pytest.mark.slow

# the digits MLP (no BatchNorm), 16 chunks of 2: one chunk per worker at the widest world
DIGITS = ["-m", "dyntrain.workloads.digits", "--model", "mlp", "--global-batch", "32",
          "--chunk-size", "2", "--max-steps", "48", "--log-every", "0"]


def test_sixteen_workers_through_waves_of_joins_and_kills_and_a_leave_match_one(tmp_path):
    static, elastic = tmp_path / "static", tmp_path / "elastic"
    # 0.1 s per chunk in the elastic run: time for each wave to take effect before the end
    run_cli(["run", "--workers", "1", "--quiet", "--no-tensorboard", "--out", static, *DIGITS],
            check=True, timeout=300)
    # 8 -> 16 (a wave of 8 joins) -> 8 (a wave of 8 SIGKILLs) -> 7 (a graceful leave)
    proc = run_cli(["run", "--workers", "1:16", "--nproc", "8", "--quiet", "--no-tensorboard",
                    "--out", elastic, "--events", "step=3:join=8,step=6:kill=8,step=9:leave=1",
                    *DIGITS, "--step-delay", "0.1"], check=True, timeout=600)
    # (the first workers may start a smaller world that the others join as they come)
    changes = [(e["event"], e["world_before"], e["world_after"], len(e["workers"]))
               for e in read_jsonl(elastic / "events.jsonl") if e["event"] != "start"]
    assert ("crash", 16, 8, 8) in changes and ("leave", 8, 7, 1) in changes, proc.stdout
    rows = read_jsonl(elastic / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 49))  # every step applied once
    assert [w for w in (r["world_size"] for r in rows) if w >= 7][-3:] == [7, 7, 7]
    assert 16 in {r["world_size"] for r in rows}, changes
    a = torch.load(static / "final.pt", weights_only=True)
    b = torch.load(elastic / "final.pt", weights_only=True)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "the model differs from the static run's"
