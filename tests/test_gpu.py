"""GPU paths (CUDA tensors, NCCL, GradScaler on CUDA). CI has no GPU: these skip cleanly there."""

import pytest
import torch

from conftest import SCRIPTS, read_jsonl, run_cli

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs two GPUs")


@cuda
def test_cuda_steps_match_cpu_steps():
    from dyntrain.elastic.config import TrainConfig
    from dyntrain.elastic.stepper import ChunkStepper
    from test_stepper import assert_same, make_worker, train

    config = TrainConfig(global_batch=40, chunk_size=5)
    cpu = train([1] * 3, steps=3, config=config)
    parts = make_worker()
    parts.model.cuda()
    parts.optimizer = torch.optim.SGD(parts.model.parameters(), lr=0.1, momentum=0.9,
                                      nesterov=True)
    parts.lr_scheduler = torch.optim.lr_scheduler.StepLR(parts.optimizer, step_size=3, gamma=0.5)
    from test_stepper import dataset, loss_fn

    stepper = ChunkStepper(config, parts, dataset(), loss_fn, torch.device("cuda"))
    for step in range(3):
        stepper.apply(stepper.compute(step, stepper.my_chunks(0, 1)))
    parts.model.cpu()
    assert_same(cpu, parts, atol=1e-4)  # cuDNN/cuBLAS kernels differ from CPU ones


@cuda
def test_grad_scaler_on_cuda_trains():
    from dyntrain.elastic.config import TrainConfig
    from dyntrain.elastic.stepper import ChunkStepper
    from test_stepper import dataset, loss_fn, make_worker

    parts = make_worker()
    parts.model.cuda()
    parts.optimizer = torch.optim.SGD(parts.model.parameters(), lr=0.1)
    parts.lr_scheduler = None
    parts.scaler = torch.amp.GradScaler("cuda", init_scale=2.0**16)
    config = TrainConfig(global_batch=40, chunk_size=5)
    stepper = ChunkStepper(config, parts, dataset(), loss_fn, torch.device("cuda"))
    losses = [stepper.apply(stepper.compute(s, stepper.my_chunks(0, 1))).loss for s in range(20)]
    assert losses[-1] < losses[0]


@two_gpus
def test_nccl_elastic_run_exactly_once(tmp_path):
    out = tmp_path / "run"
    run_cli(["run", "--workers", "1:2", "--nproc", "2", "--out", out, "--events",
             "step=20:kill=1", SCRIPTS / "ledger_train.py", "--device", "cuda"], check=True)
    sizes = {r["world_size"] for r in read_jsonl(out / "metrics.jsonl")}
    assert sizes == {1, 2}
