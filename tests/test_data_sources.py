"""Image sources: folder, packed shards (round trip, fsspec URLs, webdataset), clear errors."""

import tarfile

import pytest
import torch

from dyntrain.data import (
    DataError,
    ImageDataset,
    ImageFolder,
    ImageTransform,
    PackedShards,
    open_source,
    pack,
)
from dyntrain.data.images import decode
from dyntrain.workloads.digits_images import write_digits_images


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("digits")
    write_digits_images(root, size=16, per_class=3)
    png = tmp_path_factory.mktemp("png")
    write_digits_images(png, size=16, per_class=1, fmt="png")
    # a class folder of PNGs next to JPEGs: both are read, in sorted order
    for f in (png / "train" / "3").iterdir():
        f.rename(root / "train" / "3" / f.name)
    return root


def test_pack_round_trip_keeps_every_sample_and_label(images, tmp_path):
    folder = ImageFolder(str(images / "train"))
    summary = pack(str(images / "train"), str(tmp_path / "packed"), shard_bytes=2000)
    packed = open_source(str(tmp_path / "packed"))
    assert isinstance(packed, PackedShards) and summary.shards > 1
    assert summary.samples == len(folder) == len(packed) == 31
    assert packed.classes == folder.classes == [str(d) for d in range(10)]
    for i in range(len(folder)):
        a, b = folder.read(i), packed.read(i)
        assert (a.data, a.label) == (b.data, b.label)
        assert b.name.endswith(a.name[-4:])  # .jpg / .png kept
    # random access in any order, as the sampler asks
    assert packed.read(17).data == folder.read(17).data
    with pytest.raises(DataError, match="already holds a pack"):
        pack(str(images / "train"), str(tmp_path / "packed"))


def test_shards_are_webdataset_tars(images, tmp_path):
    pack(str(images / "train"), str(tmp_path / "p"), shard_bytes=1 << 20)
    with tarfile.open(tmp_path / "p" / "shard-000000.tar") as tar:
        names = tar.getnames()
        assert names[:2] == ["00000000.jpg", "00000000.cls"]
        assert tar.extractfile("00000000.cls").read() == b"0"
    wds = pytest.importorskip("webdataset")
    samples = list(wds.WebDataset(str(tmp_path / "p" / "shard-000000.tar"), shardshuffle=False))
    packed = PackedShards(str(tmp_path / "p"))
    assert len(samples) == len(packed)
    assert samples[5]["__key__"] == "00000005"
    assert samples[5]["jpg"] == packed.read(5).data
    assert int(samples[5]["cls"]) == packed.read(5).label


def test_fsspec_urls(images, tmp_path):
    by_url = ImageFolder(f"file://{images}/train")
    assert len(by_url) == 31
    assert by_url.read(0).data == ImageFolder(str(images / "train")).read(0).data
    pack(f"file://{images}/train", "memory://dyntrain-test/packed")
    mem = open_source("memory://dyntrain-test/packed")
    assert isinstance(mem, PackedShards) and mem.read(30).data == by_url.read(30).data


def test_missing_and_corrupt_files_name_the_file(images, tmp_path):
    with pytest.raises(DataError, match="image folder not found: .*nowhere"):
        ImageFolder(str(tmp_path / "nowhere"))
    (tmp_path / "empty" / "a").mkdir(parents=True)
    with pytest.raises(DataError, match="no .jpg"):
        ImageFolder(str(tmp_path / "empty"))
    bad = tmp_path / "bad"
    (bad / "cat").mkdir(parents=True)
    (bad / "cat" / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    good = next((images / "train" / "1").iterdir()).read_bytes()
    (bad / "cat" / "truncated.jpg").write_bytes(good[: len(good) // 2])
    ds = ImageDataset(str(bad), ImageTransform(size=8))
    with pytest.raises(DataError, match=r"cannot decode image .*broken\.jpg"):
        ds[0]
    with pytest.raises(DataError, match=r"cannot decode image .*truncated\.jpg"):
        ds[1]
    (bad / "cat" / "broken.jpg").unlink()
    with pytest.raises(DataError, match=r"cannot read image .*broken\.jpg"):
        ds[0]
    pack(str(images / "train"), str(tmp_path / "p"))
    (tmp_path / "p" / "shard-000000.tar").write_bytes(b"")
    with pytest.raises(DataError, match=r"shard-000000\.tar:00000000\.jpg .* truncated"):
        PackedShards(str(tmp_path / "p")).read(0)
    (tmp_path / "p" / "index.npy").unlink()
    with pytest.raises(DataError, match="cannot read the shard index"):
        PackedShards(str(tmp_path / "p"))


def test_image_dataset_outputs(images):
    ds = ImageDataset(str(images / "train"), ImageTransform(size=12, flip=False))
    torch.manual_seed(0)
    x, y = ds[0]
    assert x.shape == (3, 12, 12) and x.dtype == torch.float32 and y == 0
    val = ImageDataset(str(images / "val"), ImageTransform(size=12).evaluation())
    a, b = val[4][0], val[4][0]
    assert torch.equal(a, b)  # no randomness in validation
    img = decode(val.source.read(4).data, "x")
    assert a.shape == (3, 12, 12) and img.shape == (3, 16, 16) and img.dtype == torch.uint8


def test_jpeg_decoding_equals_pil_and_falls_back_to_it():
    """JPEGs go through libjpeg-turbo directly (simplejpeg): the same pixels as PIL; what it
    cannot decode (CMYK) goes to PIL, and a grey JPEG becomes three equal channels."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    for mode, sub in (("RGB", 0), ("RGB", 2), ("L", 0), ("CMYK", 0)):
        img = Image.fromarray(rgb).convert(mode)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90, subsampling=sub)
        data = buf.getvalue()
        with Image.open(io.BytesIO(data)) as ref:
            want = torch.from_numpy(np.array(ref.convert("RGB"))).permute(2, 0, 1)
        got = decode(data, f"x.{mode}.jpg")
        assert got.shape == (3, 37, 53) and torch.equal(got, want), (mode, sub)
    with pytest.raises(DataError, match=r"cannot decode image y\.jpg"):
        decode(data[:40], "y.jpg")


def test_pack_command(images, tmp_path):
    from conftest import run_cli

    proc = run_cli(["data", "pack", images / "train", tmp_path / "p", "--shard-size", "0.002"])
    assert proc.returncode == 0, proc.stderr
    assert "packed 31 samples of 10 classes into" in proc.stdout
    assert len(PackedShards(str(tmp_path / "p"))) == 31
    again = run_cli(["data", "pack", images / "train", tmp_path / "p"])
    assert again.returncode == 2 and "already holds a pack" in again.stderr
    assert "Traceback" not in again.stderr
