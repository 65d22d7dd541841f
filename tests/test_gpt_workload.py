"""The GPT workload: the standard library as a byte corpus, the model, and an elastic run through
joins, a kill and a leave that is bitwise the static run."""

import math

import pytest
import torch
from torch.utils.data import TensorDataset

from conftest import read_jsonl, run_cli, shared_static_run
from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.state import TrainingParts
from dyntrain.workloads import gpt
from dyntrain.workloads.gpt_model import GPT, PRESETS, GPTConfig, WarmupCosineLR, adamw_groups
from dyntrain.workloads.textcorpus import (
    byte_windows,
    corpus_files,
    is_validation,
    load_corpus,
    stdlib_root,
)
from test_elastic_e2e import world_sizes
from test_stepper import assert_same, train

# ~250k parameters, 32-byte samples, 4 chunks per step: a few seconds of CPU for 20 steps
SMALL = ["--model", "tiny", "--d-model", "96", "--seq-len", "32", "--global-batch", "8",
         "--chunk-size", "2", "--max-steps", "20", "--warmup-steps", "4", "--val-every", "5",
         "--val-samples", "8", "--checkpoint-every", "4"]



def static_small(tmp_path_factory):
    """The workload alone with ``SMALL`` (``conftest.static_run``), made once per test session:
    the reference of every elastic run of these settings, at any shard level."""
    return shared_static_run(tmp_path_factory, "gpt-small", "-m", "dyntrain.workloads.gpt",
                             *SMALL)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def test_the_corpus_is_the_standard_library_split_by_file(corpus):
    files = corpus_files(stdlib_root())
    relative = [p.relative_to(stdlib_root()).as_posix() for p in files]
    assert relative == sorted(relative) and "os.py" in relative
    assert not any(part in ("site-packages", "test") for r in relative for part in r.split("/"))
    val = [p for p, r in zip(files, relative, strict=True) if is_validation(r)]
    assert 0 < len(val) < len(files) / 10
    assert corpus.val_files == len(val) and corpus.train_files == len(files) - len(val)
    assert corpus.val.numel() == sum(p.stat().st_size for p in val)
    assert corpus.train.numel() + corpus.val.numel() == sum(p.stat().st_size for p in files)
    assert load_corpus().digest == corpus.digest  # deterministic


def test_sample_i_is_the_window_at_offset_i_times_seq_len(corpus):
    windows = byte_windows(corpus.train, 32)
    assert isinstance(windows, TensorDataset)  # the stepper slices it directly
    assert len(windows) == (corpus.train.numel() - 1) // 32
    for i in (0, 1, 12345, len(windows) - 1):
        assert torch.equal(windows[i][0], corpus.train[i * 32 : i * 32 + 33])
    # views into the stream, not a copy of it
    assert windows.tensors[0].untyped_storage().data_ptr() == \
        corpus.train.untyped_storage().data_ptr()


def test_another_corpus_folder_and_its_errors(tmp_path, capsys):
    names = [f"m{i}.py" for i in range(60)]
    assert any(map(is_validation, names)) and not all(map(is_validation, names))
    for i, name in enumerate(names):
        (tmp_path / name).write_text(f"x = {i}\n" * 40)
    corpus = load_corpus(tmp_path)
    assert corpus.train_files + corpus.val_files == 60
    with pytest.raises(SystemExit) as exit_:
        gpt.main(["--corpus", str(tmp_path / "missing")])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == \
        f"gpt: error: corpus folder {tmp_path / 'missing'} does not exist"
    with pytest.raises(SystemExit):
        gpt.main(["--d-model", "96", "--n-head", "5", "--corpus", str(tmp_path)])
    assert capsys.readouterr().err.strip() == "gpt: error: n_head 5 does not divide d_model 96"
    with pytest.raises(SystemExit) as exit_:  # checkpoints by time: a positive number
        gpt.main(["--checkpoint-seconds", "-1", "--corpus", str(tmp_path)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == \
        "gpt: error: checkpoint_every_seconds must be positive"


def test_help_names_the_presets_and_the_corpus(capsys):
    with pytest.raises(SystemExit) as exit_:
        gpt.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "standard library" in out and all(name in out for name in PRESETS)
    assert "--precision {fp32,bf16}" in out and "--step-delay" in out


def test_the_model_is_causal_with_tied_embeddings():
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=4, d_model=32, seq_len=16)
    model = GPT(cfg).eval()
    assert sum(p.numel() for p in model.parameters()) == cfg.parameters()
    assert not any("head" in name for name in model.state_dict())  # logits use tok.weight
    x = torch.randint(0, 256, (2, 16))
    y = x.clone()
    y[:, 10] = (y[:, 10] + 1) % 256
    a, b = model(x), model(y)
    assert torch.equal(a[:, :10], b[:, :10]) and not torch.equal(a[:, 10:], b[:, 10:])
    decay, plain = adamw_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and all(p.dim() >= 2 for p in decay["params"])
    assert plain["weight_decay"] == 0.0 and all(p.dim() == 1 for p in plain["params"])
    # the presets are the sizes they are named after
    for name, millions in (("25m", 25), ("100m", 100)):
        layers, heads, width = PRESETS[name]
        count = GPTConfig(layers, heads, width, 256).parameters()
        assert abs(count / 1e6 - millions) < 0.05 * millions


def test_warmup_then_cosine_decay_per_step():
    opt = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = WarmupCosineLR(opt, warmup_steps=4, total_steps=14, min_ratio=0.1)
    lrs = []
    for _ in range(14):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert lrs[4] == 1.0 and math.isclose(lrs[9], 0.55) and lrs[13] > 0.1
    assert all(a > b for a, b in zip(lrs[4:], lrs[5:], strict=False))
    assert math.isclose(sched.factor(14), 0.1)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_step_is_the_same_at_any_world_size(corpus, precision):
    """Simulated workers in one process: bf16 autocast and clipping included."""
    windows = byte_windows(corpus.train[:20000], 16)

    def make():
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=1, n_head=2, d_model=32, seq_len=16))
        opt = torch.optim.AdamW(adamw_groups(model, 0.1), lr=3e-3, betas=(0.9, 0.95))
        return TrainingParts(model, opt, WarmupCosineLR(opt, 2, 5))

    config = TrainConfig(global_batch=8, chunk_size=2, grad_clip_norm=0.5)
    loss = gpt.next_byte_loss(precision, torch.device("cpu"))
    one = train([1] * 4, steps=4, config=config, make=make, ds=windows, loss=loss)
    many = train([3, 2, 4, 1], steps=4, config=config, make=make, ds=windows, loss=loss)
    assert_same(one, many)


@pytest.mark.slow
def test_an_elastic_run_is_bitwise_the_static_run(tmp_path, tmp_path_factory):
    static, elastic = static_small(tmp_path_factory), tmp_path / "elastic"  # the workload alone
    # 1 -> 3 (joins) -> 2 (SIGKILL) -> 1 (rank 0 leaves); each event waits for the last to settle
    proc = run_cli(["run", "--workers", "1:3", "--nproc", "1", "--out", elastic, "--events",
                    "step=2:join=2,step=5:kill=1,step=8:leave=rank:0", "-m",
                    "dyntrain.workloads.gpt", *SMALL, "--step-delay", "0.15"], check=True)
    assert "event(s) never fired" not in proc.stdout
    assert world_sizes(elastic)[:4] == [1, 3, 2, 1], proc.stdout
    a = torch.load(static / "final.pt", weights_only=True)
    b = torch.load(elastic / "final.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = read_jsonl(elastic / "metrics.jsonl")
    validated = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in validated] == [5, 10, 15, 20]
    assert all(math.isclose(r["val_perplexity"], math.exp(r["val_loss"]), rel_tol=1e-4)
               for r in validated)
    assert validated[-1]["val_loss"] < validated[0]["val_loss"]
    assert (elastic / "result.json").read_text() == (static / "result.json").read_text()
