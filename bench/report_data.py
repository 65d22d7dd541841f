"""The benchmark report of the input pipeline (three benchmarks on one page)."""

from __future__ import annotations

from statistics import median

from report_pages import Page, Run, md_table


def _loader_throughput(data: dict) -> str:
    rows = [[r["pipeline"], r["processes"], f"{r['images_per_s']:.0f}", f"{r['ratio']:.2f}x",
             f"{r['cpu_ms_per_image']:.2f}", f"{r['cpu_ratio']:.2f}x"] for r in data["rows"]]
    return md_table(["pipeline", "processes", "images/s (median)",
                     "vs baseline (median of rounds)", "CPU ms/image",
                     "images per CPU-second vs baseline"], rows, right=(1, 2, 3, 4, 5))


def _train_through_loader(data: dict) -> str:
    rows = []
    for side, label in (("pre-loaded tensors", "pre-loaded tensors"),
                        ("loader", f"through the loader, {data['args']['loader_workers']} "
                                   "processes")):
        cpu = data["cpu_s_per_step"][side]
        rows.append([label, f"{median(data['samples_per_s'][side]):.0f}",
                     f"{median(c[0] for c in cpu) * 1000:.1f}",
                     f"{median(c[1] for c in cpu) * 1000:.1f}"])
    ratios = sorted(data["ratios"])
    return (md_table(["side", "samples/s (median)", "training CPU ms/step",
                      "loader CPU ms/step"], rows, right=(1, 2, 3))
            + f"\n\nRatio **{data['ratio_median']:.2f}** (median of {len(ratios)} per-round "
              f"ratios, {ratios[0]:.2f}-{ratios[-1]:.2f}).")


def _loader_rescale(data: dict) -> str:
    rows = []
    for r in data["runs"]:
        for kind, values in r["latency_s"].items():
            rows.append([r["loader_workers"], kind, len(values), f"{median(values):.2f}",
                         f"{r['step_s']:.2f}" if kind == "join" else "",
                         r["respawned_loader_processes"] if kind == "join" else ""])
    return md_table(["loader processes per worker", "change", "n", "median s", "median step s",
                     "loader processes respawned"], rows, right=(0, 2, 3, 4, 5))


def _input_pipeline(data: dict, run: Run) -> str:
    render = {"loader_throughput.json": _loader_throughput,
              "train_through_loader.json": _train_through_loader,
              "loader_rescale.json": _loader_rescale}[run.file]
    return render(data)


_LOADER_RESCALE_LOADED = md_table(
    ["loader processes per worker", "change", "n", "median s, load 2.1", "median s, load 8-9",
     "median s, load 16-17", "median step s (2.1 / 8-9 / 16-17)"],
    [[2, "join", 4, "**0.17**", "0.58", "1.35", "0.07 / 0.22 / 0.45"],
     [2, "leave", 2, "**0.23**", "0.71", "1.16", ""],
     [2, "kill", 2, "**0.19**", "0.63", "1.17", ""],
     [0, "join", 4, "0.24", "0.47", "0.73", "0.09 / 0.22 / 0.44"],
     [0, "leave", 2, "0.25", "0.56", "0.81", ""],
     [0, "kill", 2, "0.20", "0.56", "1.07", ""]], right=(0, 2, 3, 4, 5, 6))

INPUT_PIPELINE = Page(
    slug="input-pipeline",
    title="Input pipeline",
    headline="the chunk loader decodes 1.46-1.71x the images/s of a PIL + DataLoader baseline",
    what="""
Three benchmarks of the input pipeline (`dyntrain.data`). Each alternates its sides round by
round and reports the median of per-round ratios, and CPU time per image (from /proc), which load
disturbs less than wall time.

- **Loader throughput**: 400 JPEG crops (224-500 px) of scikit-learn's sample photos, the
  ResNet-50 recipe's training transforms to 224 px, chunks of 32, 2 loader processes on each
  side. The baseline is what torchvision's ImageFolder + transforms + DataLoader do, built by hand
  with PIL + a plain `Dataset` + `DataLoader` because torchvision does not import beside this CPU
  torch (PIL decode/crop/resize/flip, then colour jitter, PCA lighting and normalisation as
  separate tensor steps per sample).
- **Training through the loader**: the `digits-resnet` recipe (small ResNet, 16 px digit JPEGs
  from packed shards, global batch 128 in chunks of 32), one training thread, world size 1,
  against the same images decoded and augmented once beforehand and held as a `TensorDataset`.
- **Rescale latency with loader processes**: the image workload under `--workers 1:4 --nproc 2`
  with the rescale benchmark's join/leave/kill/join schedule, with 2 loader processes per worker
  and with loading in the training process, side by side; from the change's request to the first
  step in the new world.
""",
    command=".venv/bin/python bench/loader_throughput.py --rounds 5 --chunks 20",
    runs=[Run("loader_throughput.json", "Loader throughput (2026-11-23)",
              command=".venv/bin/python bench/loader_throughput.py --rounds 5 --chunks 20"),
          Run("train_through_loader.json", "Training through the loader (2026-11-23)",
              command=".venv/bin/python bench/train_through_loader.py --rounds 9 --steps 30",
              note="A nearly quiet machine; 31 s."),
          Run("loader_rescale.json", "Rescale latency with loader processes (2026-11-23)",
              command=".venv/bin/python bench/loader_rescale.py --reps 2",
              note="A nearly quiet machine; 52 s.")],
    tables=_input_pipeline,
    recorded=f"""
## The same benchmarks under load (2026-11-23, recorded when they ran)

These runs' result files were replaced by the quiet runs above; their figures were recorded when
they ran, while other test suites kept the 2-core machine at a load average of 8-17.

Training through the loader at load average 14-16 (`--rounds 5`): pre-loaded tensors 340
samples/s, through the loader 189 samples/s: ratio 0.61. A 5-round run on the nearly quiet
machine just before the 9-round run above gave 0.86 (rounds 0.65-1.04).

Rescale latency with loader processes, medians in seconds at three loads:

{_LOADER_RESCALE_LOADED}

In the second repetition at load 8-9 every change with loaders took 0.37-0.49 s.
""",
    reading="""
**Loader throughput.** Goal (>= 1.0x from the folder, higher from shards) met: JPEGs are decoded
by libjpeg-turbo through simplejpeg (the same pixels as PIL, which the tests check), the colour
transform is one folded affine map, and shards need one open file each. Wall-time ratios vary
more than CPU ratios under load (rounds 1.0-2.1x).

**Training through the loader.** Ratio 0.93 nearly quiet, 0.61 at load 14-16. The goal
(>= 0.95) is **not quite met** even nearly quiet: the loader processes need about 31 ms of CPU
per step beside the training process's 48 ms, so on 2 cores they fit only when nothing else
runs; the training process itself pays ~5 ms per step for fetching chunks. Per 16 px sample the
loader spends ~0.1 ms (quiet) to ~0.3 ms (loaded) of CPU. On a GPU host (training on the GPU,
many cores) the loader has cores of its own; not yet measured on a GPU.

**Rescale with loader processes.** Loader processes are never respawned (every training worker
kept the same 2 loader processes through every change: 0 new ones seen in /proc, found as the
members of the session each worker leads). A changed plan does not wait for the old plan's
chunks: loader processes read the plan from shared memory before every sample and drop what it no
longer wants. The goal (< 0.5 s median) is **met on the nearly quiet machine** (0.17-0.23 s with
loaders) and **not met at loads 8-17, with or without a loader**: a change takes the detection,
the re-formed group's first step (0.22-0.45 s there) and the state transfer to a joiner; the
loader side still adds 0.1-0.6 s, as its processes compete with the training processes for the
same two oversubscribed cores while they refill their prefetch for the new plan.
""",
)

DATA_PAGES = [INPUT_PIPELINE]
