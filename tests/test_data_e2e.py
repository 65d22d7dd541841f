"""End to end with loader processes: real workers, real gloo, real signals, through the CLI."""

import pytest
import torch

from conftest import read_jsonl, run_cli, static_run
from dyntrain.workloads.digits_images import write_digits_images
from test_elastic_e2e import world_sizes

pytestmark = pytest.mark.slow

IMAGENET = ["-m", "dyntrain.workloads.imagenet", "--recipe", "digits-resnet", "--global-batch",
            "16", "--chunk-size", "4", "--epochs", "20", "--max-steps", "16", "--loader-workers",
            "2", "--prefetch", "3", "--val-every", "8", "--checkpoint-every", "5"]


def test_image_workload_with_loader_processes_is_bitwise_static(tmp_path):
    """2 loader processes per worker; a crash makes the survivors recompute a step whose chunks
    were prefetched: a chunk applied twice or skipped would change the parameters."""
    write_digits_images(tmp_path / "data", size=16, per_class=6)
    common = [*IMAGENET, "--data", tmp_path / "data"]
    static, elastic = tmp_path / "static", tmp_path / "elastic"
    static_run(static, *common)  # the static reference: the same workload alone
    # 1 -> 3 (joins) -> 2 (SIGKILL: the interrupted step is recomputed) -> 1 (leave of rank 0)
    proc = run_cli(["run", "--workers", "1:3", "--nproc", "1", "--out", elastic, "--events",
                    "step=3:join=2,step=6:kill=1,step=9:leave=rank:0", *common,
                    "--step-delay", "0.1"], check=True)
    assert world_sizes(elastic)[:4] == [1, 3, 2, 1], proc.stdout
    a = torch.load(static / "final.pt", weights_only=True)
    b = torch.load(elastic / "final.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = read_jsonl(elastic / "metrics.jsonl")
    assert [r["step"] for r in rows if "val_accuracy" in r] == [8, 16]
    assert "event(s) never fired" not in proc.stdout
    assert "val_accuracy" in (elastic / "result.json").read_text()
