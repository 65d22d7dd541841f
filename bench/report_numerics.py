"""The benchmark report of what pinning a job's numerics costs (``bench/numerics_cost.py``)."""

from __future__ import annotations

from report_pages import Page, Run, md_table, num

WORKLOADS = {"digits": "digits CNN", "gpt": "GPT tiny", "images": "ResNet recipe"}


def _cost(data: dict, run: Run) -> str:
    cfg = data["config"]
    rows = []
    for r in data["summary"]:
        spread = f"{r['samples_per_s_min']:.1f}-{r['samples_per_s_max']:.1f}"
        ratios = f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}"
        rows.append([WORKLOADS.get(r["workload"], r["workload"]), f"`{r['setting']}`",
                     r["label"], num(r["samples_per_s_median"], 1), spread,
                     num(r["ratio_median"], 2), ratios, num(r["to_pinned_median"], 2),
                     num(r["samples_per_cpu_s_median"], 0), num(r["cpu_to_pinned_median"], 2),
                     f"{r['threads_seen']}, {r['cpu_capability_seen']}"])
    table = md_table(["workload", "setting", "threads, kernels", "samples/s (median)",
                      "samples/s over rounds", "/ host's best", "over rounds",
                      "/ job's default", "samples per CPU-second", "/ job's default",
                      "torch saw (threads, level)"], rows, right=(3, 4, 5, 6, 7, 8, 9))
    low, high = data["load_during"]
    steps = ", ".join(f"{w['name']} {w['steps']} (after {w['warmup']})"
                      for w in cfg["workloads"])
    return (f"{cfg['rounds']} round(s) on {cfg['cores']} cores, {len(data['runs'])} runs in "
            f"{data['total_seconds'] / 60:.0f} minutes; steps measured per run: {steps}. The "
            f"1-minute load average before each run ranged {low:.1f}-{high:.1f}.\n\n{table}")


NUMERICS_COST = Page(
    slug="numerics-cost",
    title="Pinned numerics",
    headline="what a job's pinned threads and CPU kernel level cost against the host's best, "
             "per workload",
    what="""
A job pins its intra-op threads and its CPU kernel level (`dyntrain run --threads`,
`--cpu-kernels`: default 1 thread and `avx2` on x86-64) so that every worker computes the same
bits wherever it lands. `bench/numerics_cost.py` measures the training samples/s of each workload
with these settings:

- `pinned`: the job's default, 1 thread at `avx2`;
- `lowest`: 1 thread at `default`, the level any x86-64 host runs;
- `avx512`: 1 thread at `avx512`;
- `deterministic`: the job's default with `--deterministic`;
- `cores-pinned`: as many threads as the host has cores, at `avx2`;
- `best`, the host's best: as many threads as cores and the kernels torch, oneDNN and MKL pick
  by themselves (none of `ATEN_CPU_CAPABILITY`, `ONEDNN_MAX_CPU_ISA`, `MKL_CBWR` set).

The workloads, small and fp32: `dyntrain.workloads.digits` with its defaults (the CNN, global
batch 64 in chunks of 8), `dyntrain.workloads.gpt --model tiny` (64-byte windows, global batch
16 in chunks of 4) and `dyntrain.workloads.imagenet --recipe digits-resnet` (a small ResNet on
the digits as 16 px JPEGs packed into shards, as `make demo-images` trains it; global batch 128
in chunks of 32, one loader process). Each run is a fresh process (the kernel level is read when
torch loads) training one worker alone, without a coordinator, as a test's static reference; a
pinned setting is applied as a job's worker applies it. Samples/s is the global batch over the
median time between step ends in `metrics.jsonl` after the warm-up steps. Samples per
CPU-second divides the measured steps' samples by the CPU time the training process (all its
threads, not the image loader's process) spent on them, read from `/proc` as their rows appear:
on a shared machine a process gets a varying share of the cores, which moves its wall time far
more than its CPU time. The threads and kernel level torch reported are read back from each run's
`numerics.json`. The settings take turns in
rounds (every workload under every setting, in a rotating order); a ratio is taken within a
round and workload, and the table gives medians over rounds.
""",
    command=".venv/bin/python bench/numerics_cost.py",
    runs=[Run("numerics_cost.json", "Run of 2026-12-02")],
    tables=_cost,
)

NUMERICS_PAGES = [NUMERICS_COST]
