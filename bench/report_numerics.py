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
    rounds = f"{cfg['rounds']} round{'s' if cfg['rounds'] > 1 else ''}"
    if cfg.get("rounds_asked", cfg["rounds"]) > cfg["rounds"]:
        rounds += f" of the {cfg['rounds_asked']} asked (the run was stopped in the next)"
    return (f"{rounds} on {cfg['cores']} cores, {len(data['runs'])} runs in "
            f"{data['total_seconds'] / 60:.0f} minutes; steps measured per run: {steps}. The "
            f"1-minute load average before each run ranged {low:.1f}-{high:.1f}.\n\n{table}")


NUMERICS_COST = Page(
    slug="numerics-cost",
    title="Pinned numerics",
    headline="1 thread at `default` gives 0.46-0.80x, at `avx512` 1.14-1.45x the samples per "
             "CPU-second of the job's default (`avx2`); 2 threads on a loaded 2-core host ran "
             "6-15x slower than 1",
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
    reading="""
One round (at a load of 11-20 on 2 cores a run took 0.5-2.3 minutes): the spread between rounds
is not measured, and each figure is one run. On this host a process's wall-clock samples/s
follows the share of the cores it got more than its settings, so compare the 1-thread settings
by samples per CPU-second (the `deterministic` digits run: 0.64x the job's default in wall time,
1.03x in CPU time).

- **Kernel level, 1 thread**, samples per CPU-second against the job's default (`avx2`):
  `default` 0.80x (digits), 0.46x (GPT), 0.49x (ResNet); `avx512` 1.14x, 1.42x, 1.45x. The
  level torch picks by itself here is AVX-512.
- **Deterministic algorithms** (`--deterministic`): 0.91-1.03x; one round cannot tell a cost
  this small from noise.
- **Threads.** 2 threads at `avx2` gave 0.07-0.16x the samples/s of 1 thread (`cores-pinned`
  against `pinned`), and as little per CPU-second: with other processes holding the cores, the
  threads of torch's intra-op pool wait for each other at every parallel region, and they spent
  CPU time waiting. The host's best as defined above (all cores, torch's own kernels) was
  therefore slower on this host than every 1-thread setting: the job's default gave 7.5-8.9x its
  samples/s.

Not measured: an idle host or one with more cores (where more threads can pay), the
`avx512-bf16` level and bf16 autocast, `--matmul-precision` other than `highest`, GPUs.

### When to choose what

- **Threads**: keep the default, 1, on shared or small hosts. More threads can pay where every
  worker has that many idle cores (not measured here), but the job's `--threads` applies on
  every host it lands on: a worker whose cores are taken by others loses far more than the
  threads gain (here 6-15x).
- **`--cpu-kernels default`** lets any x86-64 host join, at a cost of 20-54% of the samples per
  CPU-second here (about half for the GPT and the ResNet).
- **`--cpu-kernels avx512`** where every host of the job has AVX-512: 1.14-1.45x the default's
  samples per CPU-second here; a host without it is refused.
- **`--deterministic`**: no cost that one round could tell from noise on these CPU workloads.
""",
)

NUMERICS_PAGES = [NUMERICS_COST]
