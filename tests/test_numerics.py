"""The job's numerics: what a job pins, what a host can run, what a worker proves (its canary),
and the admission policy that judges a worker's hello (``numerics``, ``canary``, ``admission``).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from conftest import ROOT
from dyntrain.elastic.admission import CanaryDigest, Candidate, NumericsRecord, judge
from dyntrain.elastic.numerics import (
    KernelLevel,
    Numerics,
    host_levels,
    host_refusal,
    merge_pin,
    numerics_from_env,
    pin_differences,
)
from dyntrain.elastic.step.canary import canary_digest
from dyntrain.errors import ConfigError

FLAGS_AVX512 = {"fma", "avx2", "avx512f", "avx512vl", "avx512bw", "avx512dq"}
FLAGS_AVX2 = {"fma", "avx2"}
CPUINFO_OLD = "processor\t: 0\nflags\t\t: fpu sse sse2 sse4_1 sse4_2 avx\n"


# ---- what a job pins ----------------------------------------------------------------------------


def test_the_defaults_never_come_from_the_host():
    pin = Numerics()
    assert (pin.threads, pin.deterministic, pin.matmul_precision) == (1, False, "highest")
    assert Numerics().cpu_kernels is (KernelLevel.AVX2 if _x86() else KernelLevel.DEFAULT)
    env = Numerics(threads=3, cpu_kernels="avx512").env()
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == env["DYNTRAIN_THREADS"] == "3"
    # ATen, oneDNN and MKL pinned together: each alone changes bits (softmax, gelu, bf16 mm)
    assert KernelLevel.AVX512.env(machine="x86_64") == {
        "ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "MKL_CBWR": "AVX512"}
    assert env["ATEN_CPU_CAPABILITY"] == "avx512"
    assert KernelLevel.DEFAULT.env(machine="aarch64") == {"ATEN_CPU_CAPABILITY": "default"}


def test_a_process_gets_the_library_variables_it_does_not_choose_itself():
    """What a plain process (a service job that is not elastic) is given: threads as a pair,
    the kernel level as a set, each left out whole where the process names one of its own."""
    pin = Numerics(threads=2, cpu_kernels="default")
    kernels = KernelLevel.DEFAULT.env()
    assert pin.library_env() == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", **kernels}
    assert pin.library_env({"OMP_NUM_THREADS": "3"}) == kernels
    assert pin.library_env({"MKL_CBWR": "AUTO"}) == {"OMP_NUM_THREADS": "2",
                                                     "MKL_NUM_THREADS": "2"}
    assert pin.library_env({"PATH": "/bin"}) == pin.library_env()


@pytest.mark.parametrize("fields, said", [
    ({"threads": 0}, "threads must be a whole number of at least 1, got 0"),
    ({"threads": 100000}, "threads must be at most 1024"),
    ({"cpu_kernels": "avx3"}, "cpu_kernels must be one of default, avx2, avx512, avx512-bf16, "
                              "got 'avx3'"),
    ({"matmul_precision": "low"}, "matmul_precision must be one of highest, high, medium"),
])
def test_a_bad_setting_is_one_line(fields, said):
    with pytest.raises(ConfigError, match=said):
        Numerics(**fields)


def test_the_environment_names_the_numerics_and_a_bad_value_is_refused():
    assert numerics_from_env({}) is None
    got = numerics_from_env({"DYNTRAIN_THREADS": "4", "DYNTRAIN_CPU_KERNELS": "DEFAULT",
                             "DYNTRAIN_DETERMINISTIC": "yes"})
    assert got == Numerics(threads=4, cpu_kernels="default", deterministic=True)
    assert numerics_from_env(Numerics(threads=2).env()) == Numerics(threads=2)
    with pytest.raises(ConfigError, match="DYNTRAIN_THREADS must be a whole number, got 'two'"):
        numerics_from_env({"DYNTRAIN_THREADS": "two"})
    with pytest.raises(ConfigError, match="DYNTRAIN_DETERMINISTIC must be 1 or 0"):
        numerics_from_env({"DYNTRAIN_DETERMINISTIC": "maybe"})


def test_a_resumed_run_keeps_its_numerics():
    recorded = Numerics(threads=2, cpu_kernels="default")
    assert merge_pin({}, recorded, "runs/a") == recorded
    assert merge_pin({"threads": 2}, recorded, "runs/a") == recorded
    assert merge_pin({"threads": 4}, None, "runs/a") == Numerics(threads=4)
    with pytest.raises(ConfigError, match=r"runs/a holds a run whose numerics are pinned "
                                          r"\(threads 2, .*\); this launch asks threads 2 -> 4"):
        merge_pin({"threads": 4}, recorded, "runs/a")


# ---- what a host can run ------------------------------------------------------------------------


def test_a_host_runs_the_levels_its_cpu_has_and_is_told_the_lowest_common_one():
    assert host_levels(FLAGS_AVX512, "x86_64") == [KernelLevel.DEFAULT, KernelLevel.AVX2,
                                                   KernelLevel.AVX512]
    assert host_levels(set(), "aarch64") == [KernelLevel.DEFAULT]
    assert host_levels(FLAGS_AVX512 - {"avx2"}, "x86_64") == [KernelLevel.DEFAULT]
    assert host_refusal(Numerics(cpu_kernels="avx2"), "host2", FLAGS_AVX512, "x86_64") is None
    said = host_refusal(Numerics(cpu_kernels="avx512"), "host2", FLAGS_AVX2, "x86_64")
    assert said == ("host2's CPU lacks avx512bw, avx512dq, avx512f, avx512vl: it cannot run the "
                    "job's cpu kernels avx512 (it runs at most avx2); start the job with "
                    "--cpu-kernels avx2 (DYNTRAIN_CPU_KERNELS=avx2), a level every host runs")
    said = host_refusal(Numerics(cpu_kernels="avx2"), "pi", set(), "aarch64")
    assert said.startswith("pi is aarch64, not x86-64: it cannot run the job's cpu kernels avx2")
    assert "--cpu-kernels default" in said


def test_the_flags_come_from_proc_cpuinfo():
    from dyntrain.elastic.numerics import cpu_flags

    assert cpu_flags(CPUINFO_OLD) == {"fpu", "sse", "sse2", "sse4_1", "sse4_2", "avx"}
    assert cpu_flags("") == set()


# ---- what a worker proves ------------------------------------------------------------------------


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), nn.BatchNorm1d(16), nn.GELU(), nn.Dropout(0.2),
                         nn.LayerNorm(16), nn.Linear(16, 3))


def _loss(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def _batch():
    g = torch.Generator().manual_seed(3)
    return torch.randn(8, 12, generator=g), torch.randint(0, 3, (8,), generator=g)


def test_the_canary_is_repeatable_and_leaves_the_model_as_it_found_it():
    model, batch = _model(), _batch()
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model[0].weight.grad = torch.ones_like(model[0].weight)
    rng = torch.random.get_rng_state()
    first = canary_digest(model, _loss, batch, seed=5, device=torch.device("cpu"))
    assert first == canary_digest(model, _loss, batch, seed=5, device=torch.device("cpu"))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert torch.equal(model[0].weight.grad, torch.ones_like(model[0].weight))
    assert model[1].weight.grad is None and not model.training
    assert torch.equal(rng, torch.random.get_rng_state())
    # it does not depend on the model's initial weights (only the first worker's matter)...
    other = _model()
    with torch.no_grad():
        other[0].weight.add_(1.0)
    assert canary_digest(other, _loss, batch, seed=5, device=torch.device("cpu")) == first
    # ... but on the data and on every computation
    x, y = batch
    moved = canary_digest(model, _loss, (x + 1e-3, y), seed=5, device=torch.device("cpu"))
    assert moved.data != first.data and moved.compute != first.compute
    assert canary_digest(model, _loss, batch, seed=6, device=torch.device("cpu")).compute != \
        first.compute  # dropout draws from the chunk's seed


CANARY_SCRIPT = """
import json, torch
from torch import nn
from dyntrain.elastic.step.canary import canary_digest
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 10))
g = torch.Generator().manual_seed(1)
batch = (torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g))
def loss(m, b):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=PRECISION == "bf16"):
        return nn.functional.cross_entropy(m(b[0]).float().softmax(-1).log(), b[1])
print(canary_digest(model, loss, batch, 0, torch.device("cpu")).compute)
"""


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_canary_sees_another_kernel_level(precision):
    """A worker whose torch picked other CPU kernels (an older host's) computes other bits; its
    canary says so."""
    if not _x86():
        pytest.skip("kernel levels are x86-64's")
    digests = {}
    for level in ("avx2", "default"):
        env = {**Numerics(cpu_kernels=level).env(), "PATH": "/usr/bin:/bin"}
        proc = subprocess.run([sys.executable, "-c", f"PRECISION = {precision!r}" +
                               CANARY_SCRIPT], env=env, capture_output=True, text=True,
                              cwd=ROOT, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        digests[level] = proc.stdout.strip()
    assert digests["avx2"] != digests["default"]


# ---- the admission policy -----------------------------------------------------------------------


SEEN = {"torch": "2.13.0", "threads": 1, "cpu_capability": "AVX2", "onednn_max_isa": "AVX2",
        "mkl_cbwr": "AVX2", "deterministic": False, "matmul_precision": "highest"}
PIN = Numerics(cpu_kernels="avx2")
OK = CanaryDigest("d", "c")


def _hello(worker="w1", settings=None, canary=OK) -> Candidate:
    return Candidate(worker, "host1", {**SEEN, **(settings or {})}, canary)


def test_the_first_worker_that_runs_the_pin_defines_the_job():
    first = judge(PIN, None, _hello("w0"), 0, False)
    assert first.admit and first.changed and first.record.first == "w0 on host1"
    assert first.record.settings == SEEN and first.record.pinned == PIN
    off = judge(PIN, None, _hello("w0", {"threads": 2}), 0, False)
    assert not off.admit and off.record is None
    assert off.reason.startswith("w0 on host1 does not run the job's pinned numerics: threads 2 "
                                 "(pinned: 1)")


def test_a_worker_that_computes_other_bits_is_refused_with_what_differs():
    record = judge(PIN, None, _hello("w0"), 0, False).record
    same = judge(PIN, record, _hello(), 7, False)
    assert same.admit and not same.changed and same.reason == ""
    torch_other = judge(PIN, record, _hello(settings={"torch": "2.14.1"}), 7, False)
    assert not torch_other.admit
    assert torch_other.reason == (
        "w1 on host1 computes other bits than the job: torch 2.14.1 (the job: 2.13.0) "
        "(--allow-mixed-numerics admits it, and the run is then no longer bitwise)")
    silent = judge(PIN, record, _hello(canary=CanaryDigest("d", "x")), 7, False)
    assert not silent.admit and "canary x (the job's c)" in silent.reason
    assert "its settings are the job's: the difference lies in what they do not name" in \
        silent.reason
    data = judge(PIN, record, _hello(canary=CanaryDigest("e", "x")), 7, False)
    assert "its first chunk's data differ (digest e, the job's d: decoding or augmentation)" in \
        data.reason
    assert not judge(PIN, record, Candidate("w1", "h", {}, OK), 7, False).admit


def test_mixed_numerics_allowed_are_admitted_and_recorded_from_that_step():
    record = judge(PIN, None, _hello("w0"), 0, False).record
    mixed = judge(PIN, record, _hello("w3", {"cpu_capability": "DEFAULT"}), 42, True)
    assert mixed.admit and mixed.changed
    assert mixed.record.bitwise_until == 42 and mixed.record.mixed[0].worker == "w3"
    assert "the run is no longer bitwise from step 42" in mixed.reason
    again = NumericsRecord.decode(mixed.record.encode(), "numerics.json")
    assert again == mixed.record
    assert json.loads(mixed.record.encode())["bitwise_until"] == 42


def test_a_record_that_is_not_one_is_said():
    with pytest.raises(ConfigError, match=r"runs/x/numerics.json is not a numerics record"):
        NumericsRecord.decode(b'{"pinned": 3}', "runs/x/numerics.json")


def test_the_pin_as_a_worker_observes_it():
    from dyntrain.elastic.numerics import observe

    seen = observe()
    assert seen["threads"] == torch.get_num_threads()
    assert seen["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert pin_differences(Numerics(threads=seen["threads"] + 1), seen)[0] == \
        f"threads {seen['threads']} (pinned: {seen['threads'] + 1})"


def _x86() -> bool:
    import platform

    return platform.machine().lower() in ("x86_64", "amd64")
