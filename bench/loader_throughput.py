"""Loader throughput: images/s of decode + augment, dyntrain's chunk loader beside a baseline.

Data: JPEG crops (224-500 px, quality 90) cut at random from scikit-learn's two sample photos
(``load_sample_images``), in the image-folder layout, and the same packed with
``dyntrain data pack``.

Baseline: what torchvision's ImageFolder + transforms + DataLoader do, built by hand because
torchvision does not import beside this machine's CPU torch: a plain ``Dataset`` that opens each
file with PIL, crops and resizes with PIL (``RandomResizedCrop``'s PIL path, bilinear), flips
with PIL, converts to a float tensor, then applies the same colour jitter (brightness,
saturation, hue as MXNet defines them), PCA lighting and normalisation as separate tensor
steps, per sample; ``DataLoader(batch_size=chunk, shuffle=True, num_workers=N)``. Same crop
parameters, same transforms, same number of processes as dyntrain.

dyntrain: ``ChunkLoader`` over ``ImageDataset`` (uint8 crop/resize with torch's antialiased
kernel, colour + lighting + normalisation as one affine map per sample), per-sample seeding,
keyed requests, from the folder and from the packed shards.

Rounds alternate the pipelines; each round times ``--chunks`` chunks after a warm-up. The
headline is the median over rounds of images/s and of the ratio to the baseline of the same
round, and the CPU time (this process plus the loader processes, from /proc) per image, which
other load on a shared machine disturbs far less than wall time.

    .venv/bin/python bench/loader_throughput.py            # ~3 minutes
"""

from __future__ import annotations

import argparse
import io
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from _common import (  # bench/ is sys.path[0] when run as a script
    fmt,
    machine_info,
    process_cpu_seconds,
    write_result,
)
from dyntrain.data import ChunkLoader, ImageDataset, ImageTransform, LoaderConfig, pack
from dyntrain.data import images as im
from dyntrain.data.sources import ImageFolder
from dyntrain.elastic.step.sampler import BatchOrder


def write_crops(root: Path, count: int, seed: int = 0) -> None:
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images  # two 427 x 640 RGB photos
    rng = np.random.default_rng(seed)
    for i in range(count):
        cls = i % len(photos)
        photo = photos[cls]
        h = int(rng.integers(224, 427))
        w = int(min(640, rng.integers(224, 501)))
        top, left = int(rng.integers(0, 427 - h + 1)), int(rng.integers(0, 640 - w + 1))
        folder = root / f"class{cls}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(photo[top:top + h, left:left + w]).save(folder / f"{i:05d}.jpg",
                                                                 quality=90)


class BaselineFolder(Dataset):
    """torchvision-style: PIL decode, PIL crop/resize/flip, then one tensor step per transform."""

    def __init__(self, root: str, t: ImageTransform) -> None:
        folder = ImageFolder(root)
        self.files, self.labels, self.t = folder.files, folder.labels, t
        self.gray = torch.tensor(im._GRAY)[:, None, None]
        self.mean = torch.tensor(t.mean)[:, None, None]
        self.std = torch.tensor(t.std)[:, None, None]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        from PIL import Image

        t = self.t
        with open(self.files[i], "rb") as f:
            img = Image.open(io.BytesIO(f.read())).convert("RGB")
        u = torch.rand(23, dtype=torch.float64).tolist()
        top, left, h, w = im.crop_box(img.height, img.width, t.scale, t.ratio, u)
        img = img.resize((t.size, t.size), Image.BILINEAR, box=(left, top, left + w, top + h))
        if u[22] < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.array(img)).permute(2, 0, 1).float()
        c = torch.rand(3, dtype=torch.float64).tolist()
        x = x * (1 + t.brightness * (2 * c[0] - 1))
        a = 1 + t.saturation * (2 * c[1] - 1)
        x = a * x + (1 - a) * (x * self.gray).sum(0, keepdim=True)
        x = torch.einsum("ij,jhw->ihw", im.hue_matrix(t.hue * (2 * c[2] - 1)).float(), x)
        x = x + im.lighting_offset(torch.randn(3) * t.pca_noise).float()[:, None, None]
        return (x - self.mean) / self.std, self.labels[i]


def time_baseline(root: str, t: ImageTransform, workers: int, chunk: int, chunks: int) -> float:
    loader = DataLoader(BaselineFolder(root, t), batch_size=chunk, shuffle=True,
                        num_workers=workers, persistent_workers=workers > 0,
                        prefetch_factor=2 if workers else None, drop_last=True)
    it = iter(loader)
    next(it)  # workers up, warm
    pids = [w.pid for w in it._workers] if workers else []
    start, cpu = time.perf_counter(), _cpu(pids)
    for _ in range(chunks):
        try:
            next(it)
        except StopIteration:
            it = iter(loader)
            next(it)
    return chunks * chunk / (time.perf_counter() - start), (_cpu(pids) - cpu) / (chunks * chunk)


def _cpu(pids) -> float:
    """CPU seconds of this process and the loader processes ``pids`` so far."""
    return time.process_time() + process_cpu_seconds(pids)


def time_dyntrain(root: str, t: ImageTransform, workers: int, chunk: int, chunks: int) -> float:
    ds = ImageDataset(root, t)
    order = BatchOrder(0, len(ds), chunk)
    steps = len(ds) // chunk * 1000
    loader = ChunkLoader(ds, order, chunk, steps, 0, torch.device("cpu"),
                         LoaderConfig(workers=workers, prefetch=2 * max(1, workers)))
    loader.expect(0, [0])
    loader.fetch(0, 0, order.chunk(0, 0, chunk))  # warm
    pids = [w.pid for w in loader._it._workers] if workers else []
    start, cpu = time.perf_counter(), _cpu(pids)
    for step in range(1, chunks + 1):
        loader.expect(step, [0])
        loader.fetch(step, 0, order.chunk(step, 0, chunk))
    rate = chunks * chunk / (time.perf_counter() - start)
    cpu_per_image = (_cpu(pids) - cpu) / (chunks * chunk)
    loader.close()
    return rate, cpu_per_image


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=400)
    ap.add_argument("--workers", type=int, nargs="+", default=[2])
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--chunks", type=int, default=40, help="chunks timed per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench/results/loader_throughput.json")
    args = ap.parse_args()
    t0 = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="loader-bench-"))
    write_crops(tmp / "folder", args.images)
    pack(str(tmp / "folder"), str(tmp / "packed"), shard_bytes=16 << 20)
    t = ImageTransform()
    sides = {"baseline (PIL + Dataset + DataLoader), folder":
             lambda w: time_baseline(str(tmp / "folder"), t, w, args.chunk, args.chunks),
             "dyntrain ChunkLoader, folder":
             lambda w: time_dyntrain(str(tmp / "folder"), t, w, args.chunk, args.chunks),
             "dyntrain ChunkLoader, packed shards":
             lambda w: time_dyntrain(str(tmp / "packed"), t, w, args.chunk, args.chunks)}
    rows = []
    for workers in args.workers:
        rates: dict[str, list[float]] = {k: [] for k in sides}
        cpus: dict[str, list[float]] = {k: [] for k in sides}
        for r in range(args.rounds):
            names = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in names:
                rate, cpu = sides[name](workers)
                rates[name].append(rate)
                cpus[name].append(cpu)
                print(f"workers {workers} round {r}: {name}: {rate:.0f} images/s, "
                      f"{cpu * 1e3:.2f} CPU ms/image", flush=True)
        base, base_cpu = rates[next(iter(sides))], cpus[next(iter(sides))]
        for name, values in rates.items():
            ratios = [v / b for v, b in zip(values, base, strict=True)]
            cpu_ratios = [b / c for c, b in zip(cpus[name], base_cpu, strict=True)]
            rows.append({"pipeline": name, "processes": workers,
                         "images_per_s": round(statistics.median(values), 1),
                         "ratio": round(statistics.median(ratios), 3),
                         "cpu_ms_per_image": round(statistics.median(cpus[name]) * 1e3, 3),
                         "cpu_ratio": round(statistics.median(cpu_ratios), 3),
                         "rounds": [round(v, 1) for v in values]})
    load = os.getloadavg()
    print(f"\n{args.images} JPEG crops (224-500 px) of load_sample_images, 224 px output, chunk "
          f"{args.chunk}, {args.rounds} rounds; load average {load[0]:.2f}")
    print("| pipeline | processes | images/s (median) | vs baseline | CPU ms/image | "
          "images per CPU-second vs baseline |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['pipeline']} | {row['processes']} | {row['images_per_s']:.0f} | "
              f"{fmt(row['ratio'], 2)}x | {row['cpu_ms_per_image']:.2f} | "
              f"{fmt(row['cpu_ratio'], 2)}x |")
    write_result(args.out, {"machine": machine_info(), "args": vars(args), "rows": rows,
                            "load_average": load, "total_seconds": time.time() - t0})
    assert all(math.isfinite(r["images_per_s"]) for r in rows)


if __name__ == "__main__":
    main()
