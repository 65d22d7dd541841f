"""scikit-learn's digits written as small JPEG files in the image-folder layout.

``dst/train/<digit>/<n>.jpg`` and ``dst/val/<digit>/<n>.jpg`` (the same stratified split as the
digits workload): a real image task read from disk, for the input pipeline's proof on a machine
that cannot download a data set.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dyntrain.errors import DyntrainError
from dyntrain.extras import needs_extra
from dyntrain.outdir import make_out_dir
from dyntrain.workloads.digits import load_digits_arrays, stratified_split


def write_digits_images(dst: str | Path, size: int = 32, per_class: int | None = None,
                        quality: int = 90, fmt: str = "jpg") -> dict[str, int]:
    """Write the digits as ``size`` x ``size`` RGB images; returns the count per split.

    ``per_class`` keeps only the first N images of each class in each split (small tests)."""
    with needs_extra("writing the digits as images"):
        from PIL import Image

    x, y = load_digits_arrays()
    train_idx, val_idx = stratified_split(y, 0.2, 0)
    pixels = (x[:, 0].numpy() * 255).round().astype(np.uint8)
    counts = {}
    for split, idx in (("train", train_idx), ("val", val_idx)):
        taken: dict[int, int] = {}
        for i in idx.tolist():
            label = int(y[i])
            if per_class is not None and taken.get(label, 0) >= per_class:
                continue
            taken[label] = taken.get(label, 0) + 1
            folder = Path(dst) / split / str(label)
            folder.mkdir(parents=True, exist_ok=True)
            img = Image.fromarray(pixels[i], mode="L").resize((size, size), Image.BILINEAR)
            img = img.convert("RGB")
            path = folder / f"{i:04d}.{fmt}"
            if fmt == "jpg":
                img.save(path, quality=quality)
            else:
                img.save(path)
        counts[split] = sum(taken.values())
    return counts


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="dyntrain.workloads.digits_images", description=__doc__)
    ap.add_argument("dst", help="folder to write train/ and val/ into")
    ap.add_argument("--size", type=int, default=16, help="image side in pixels [16]")
    args = ap.parse_args(argv)
    try:
        make_out_dir(args.dst, "DST")
        counts = write_digits_images(args.dst, size=args.size)
    except DyntrainError as exc:
        ap.exit(2, f"{ap.prog}: error: {exc}\n")
    print(f"wrote {counts['train']} training and {counts['val']} validation JPEGs "
          f"({args.size}x{args.size}) to {args.dst}")


if __name__ == "__main__":
    main()
