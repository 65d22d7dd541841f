"""``dyntrain data``: prepare training data (pack an image folder into indexed tar shards)."""

from __future__ import annotations

import click


@click.group()
def data() -> None:
    """Prepare training data."""


@data.command()
@click.argument("src")
@click.argument("dst")
@click.option("--shard-size", default=256.0, show_default=True, type=float,
              help="MiB of image data per shard.")
def pack(src: str, dst: str, shard_size: float) -> None:
    """Pack SRC (an image folder: SRC/<class>/<image>.jpg|png) into WebDataset tar shards plus an
    index in DST, for fast sequential reads and reads by sample index. SRC and DST are local
    paths or fsspec URLs."""
    from dyntrain.data.pack import pack as pack_folder

    s = pack_folder(src, dst, shard_bytes=max(1, int(shard_size * (1 << 20))))
    click.echo(f"packed {s.samples} samples of {s.classes} classes into {s.shards} shard(s), "
               f"{s.bytes / (1 << 20):.1f} MiB, in {s.seconds:.1f} s -> {dst}")
