"""GPU paths (CUDA tensors, NCCL, GradScaler on CUDA). CI has no GPU: these skip cleanly there."""

import json
import math

import pytest
import torch

from conftest import SCRIPTS, read_jsonl, run_cli

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs two GPUs")


def _train_on_cuda(worlds: list[int]) -> dict[str, torch.Tensor]:
    """``test_stepper.train`` on the GPU; the first replica's model, on the CPU."""
    from test_stepper import make_worker, train

    def cuda_worker():
        parts = make_worker()
        parts.model.cuda()
        parts.optimizer = torch.optim.SGD(parts.model.parameters(), lr=0.1, momentum=0.9,
                                          nesterov=True)
        parts.lr_scheduler = torch.optim.lr_scheduler.StepLR(parts.optimizer, 3, gamma=0.5)
        return parts

    parts = train(worlds, steps=len(worlds), make=cuda_worker, device=torch.device("cuda"))
    return {k: v.cpu() for k, v in parts.model.state_dict().items()}


@cuda
def test_cuda_steps_are_bitwise_the_same_at_every_world_size():
    """On the GPU as on the CPU, the steps' split over workers leaves no trace in the bits
    (dropout masks come per chunk from the CUDA generator; the CPU's generator draws other
    masks, so a GPU run is compared with GPU runs only)."""
    alone = _train_on_cuda([1] * 4)
    for worlds in ([3] * 4, [2, 3, 1, 4]):
        split = _train_on_cuda(worlds)
        assert all(torch.equal(alone[k], split[k]) for k in alone), worlds


@cuda
def test_a_steps_chunks_reach_the_gpu_without_waiting_for_it():
    """Each chunk's batch goes to the GPU from pinned memory: from pageable memory a copy waits
    until the GPU has run everything queued before it, so the next chunk's kernels could not be
    queued while this chunk's run (``bench/gpu_gpt.py`` measured ~20 ms a step of it)."""
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.data import TensorDataset

    from dyntrain.elastic.config import TrainConfig
    from dyntrain.elastic.state import TrainingParts
    from dyntrain.elastic.step.stepper import ChunkStepper
    from dyntrain.workloads.gpt import next_byte_loss
    from dyntrain.workloads.gpt_model import GPT, GPTConfig

    torch.manual_seed(0)
    gpu = torch.device("cuda")
    model = GPT(GPTConfig(n_layer=2, n_head=2, d_model=64, seq_len=16)).to(gpu)
    data = TensorDataset(torch.randint(0, 256, (64, 17), dtype=torch.uint8))
    parts = TrainingParts(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    stepper = ChunkStepper(TrainConfig(global_batch=16, chunk_size=4), parts, data,
                           next_byte_loss("fp32", gpu), gpu)
    stepper.apply(stepper.compute(0, stepper.my_chunks(0, 1)))  # allocations, kernels chosen
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        stepper.compute(1, stepper.my_chunks(0, 1))
        torch.cuda.synchronize()
    copies = [e.name for e in prof.events() if "Memcpy HtoD" in e.name]
    assert len(copies) >= 4, f"the profiler saw {copies} (a copy per chunk expected)"
    assert not [c for c in copies if "Pageable" in c], copies


@cuda
def test_grad_scaler_on_cuda_trains():
    from dyntrain.elastic.config import TrainConfig
    from dyntrain.elastic.step.stepper import ChunkStepper
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


def _same_final(a, b) -> None:
    x = torch.load(a / "final.pt", weights_only=True, map_location="cpu")
    y = torch.load(b / "final.pt", weights_only=True, map_location="cpu")
    assert x.keys() == y.keys()
    differ = [k for k in x if not torch.equal(x[k], y[k])]
    assert not differ, f"tensors that differ: {differ}"


@cuda
def test_two_workers_on_one_gpu_over_gloo_train_the_static_runs_model(tmp_path):
    """One GPU, two worker processes on it: NCCL refuses two ranks on one device, gloo carries
    the CUDA tensors. A kill and a join hand the state over in CUDA tensors; every sample
    counts exactly once and the model is the static run's, bit for bit."""
    static, elastic = tmp_path / "static", tmp_path / "elastic"
    common = [SCRIPTS / "ledger_train.py", "--device", "cuda", "--backend", "gloo",
              "--epochs", "6"]
    run_cli(["run", "--workers", "1:1", "--out", static, *common], check=True)
    proc = run_cli(["run", "--workers", "1:2", "--nproc", "2", "--out", elastic, "--events",
                    "step=8:kill=1,step=14:join=1", *common, "--step-delay", "0.05"],
                   check=True)
    assert "event(s) never fired" not in proc.stdout
    assert {r["world_size"] for r in read_jsonl(elastic / "metrics.jsonl")} == {1, 2}
    _same_final(static, elastic)


GPT_TINY = ["-m", "dyntrain.workloads.gpt", "--model", "tiny", "--seq-len", "32",
            "--global-batch", "8", "--chunk-size", "2", "--max-steps", "24", "--warmup-steps",
            "2", "--val-every", "6", "--val-samples", "8", "--checkpoint-every", "4",
            "--device", "cuda"]


@cuda
def test_gpt_trains_in_bf16_on_the_gpu_and_reports_its_memory(tmp_path):
    out = tmp_path / "run"
    run_cli(["run", "--workers", "1:1", "--out", out, *GPT_TINY, "--precision", "bf16"],
            check=True)
    result = json.loads((out / "result.json").read_text())
    values = result.get("values", result)
    assert values["device"] == "cuda" and values["gpu_peak_mib"] > 0
    losses = [r["loss"] for r in read_jsonl(out / "metrics.jsonl") if "loss" in r]
    assert len(losses) == 24 and all(math.isfinite(x) for x in losses)
    assert math.isfinite(values["val_loss"])


@cuda
def test_a_sharded_gpt_on_one_gpu_is_bitwise_the_unsharded_static_run(tmp_path):
    """ZeRO-1 with CUDA tensors: two workers on one GPU over gloo, the AdamW state sharded
    with r = 2, a join and a kill (nothing lost): the static unsharded run's model."""
    static, elastic = tmp_path / "static", tmp_path / "elastic"
    run_cli(["run", "--workers", "1:1", "--out", static, *GPT_TINY, "--backend", "gloo"],
            check=True)
    proc = run_cli(["run", "--workers", "1:3", "--nproc", "2", "--out", elastic, "--events",
                    "step=3:join=1,step=9:kill=1", *GPT_TINY, "--backend", "gloo", "--shard",
                    "1", "--step-delay", "0.2"], check=True)  # a joiner's CUDA start is slow
    assert "event(s) never fired" not in proc.stdout
    assert len({r["world_size"] for r in read_jsonl(elastic / "metrics.jsonl")}) >= 2
    _same_final(static, elastic)


def test_gpt_refuses_cuda_without_a_gpu_in_one_line(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = run_cli(["run", "--workers", "1:1", "--out", tmp_path / "run", *GPT_TINY])
    assert proc.returncode != 0
    assert ("job failed: no worker could start: gpt: error: --device cuda: this torch sees no "
            "CUDA device") in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


@cuda
def test_a_worker_on_a_gpu_observes_its_architecture_and_runs_its_canary_there():
    """The numerics a GPU worker reports name the device's architecture and libraries (a worker
    on another GPU type is refused), and its canary is computed on the device, repeatably."""
    from torch import nn

    from dyntrain.elastic.numerics import observe
    from dyntrain.elastic.step.canary import canary_digest

    seen = observe("cuda")
    assert seen["gpu_arch"].startswith("sm_") and seen["cuda"] == torch.version.cuda
    assert {"cudnn", "cudnn_allow_tf32", "cuda_matmul_allow_tf32"} <= seen.keys()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 4))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)

    def loss(m, batch):
        return nn.functional.cross_entropy(m(batch[0]), batch[1])

    device = torch.device("cuda")
    on_gpu = canary_digest(model.to(device), loss, (x.to(device), y.to(device)), 0, device)
    assert on_gpu == canary_digest(model, loss, (x.to(device), y.to(device)), 0, device)
    on_cpu = canary_digest(model.cpu(), loss, (x, y), 0, torch.device("cpu"))
    assert on_gpu.data == on_cpu.data  # the same chunk, computed on another device
