"""The article's augmentations: crop geometry, colour algebra, PCA lighting statistics."""

import math

import pytest
import torch

from dyntrain.data import images as im
from dyntrain.data.images import ImageTransform, crop_box, hue_matrix, lighting_offset
from dyntrain.errors import ConfigError


def test_crop_box_keeps_area_and_aspect_in_range():
    gen = torch.Generator().manual_seed(0)
    for _ in range(2000):
        h, w = (int(v) for v in torch.randint(20, 500, (2,), generator=gen))
        u = torch.rand(23, dtype=torch.float64, generator=gen).tolist()
        top, left, ch, cw = crop_box(h, w, (0.08, 1.0), (3 / 4, 4 / 3), u)
        assert 0 <= top and top + ch <= h and 0 <= left and left + cw <= w
        # rounding to whole pixels moves the aspect ratio a little
        assert 3 / 4 * (1 - 2 / min(ch, cw)) <= cw / ch <= 4 / 3 * (1 + 2 / min(ch, cw))
        if max(h, w) <= 2 * min(h, w):  # (very elongated images may fall back to centre crops)
            assert ch * cw >= 0.08 * h * w - (ch + cw + 1)  # within rounding of the min area
    # an image too elongated for any try: the centre crop clamped to the ratio range
    assert crop_box(10, 400, (0.9, 1.0), (3 / 4, 4 / 3), [0.5] * 23) == (0, 193, 10, 13)


def test_colour_algebra_matches_mxnet_definitions():
    assert torch.allclose(hue_matrix(0.0), torch.eye(3, dtype=torch.float64), atol=2e-3)
    gray = torch.tensor([100.0, 100.0, 100.0], dtype=torch.float64)
    # hue rotation and saturation leave gray pixels gray (YIQ's I and Q are zero)
    assert torch.allclose(hue_matrix(0.3) @ gray, gray, atol=0.5)
    t = ImageTransform(brightness=0, saturation=0.4, hue=0, pca_noise=0, mean=(0, 0, 0),
                       std=(1, 1, 1))
    torch.manual_seed(3)
    m, b = t.color_affine()
    assert torch.allclose(m @ gray.float(), gray.float(), atol=1e-3) and b.abs().max() == 0


def test_folded_affine_equals_the_steps_one_by_one():
    t = ImageTransform(size=8)
    img = torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8)
    torch.manual_seed(11)
    m, b = t.color_affine()
    torch.manual_seed(11)  # the same draws, applied step by step as MXNet does
    u = torch.rand(3, dtype=torch.float64).tolist()
    noise = torch.randn(3, dtype=torch.float64)
    x = img.to(torch.float64)
    x = x * (1 + 0.4 * (2 * u[0] - 1))
    gray = (x * torch.tensor(im._GRAY, dtype=torch.float64)[:, None, None]).sum(0, keepdim=True)
    a = 1 + 0.4 * (2 * u[1] - 1)
    x = a * x + (1 - a) * gray
    x = torch.einsum("ij,jhw->ihw", hue_matrix(0.4 * (2 * u[2] - 1)), x)
    x = x + lighting_offset(noise * 0.1)[:, None, None]
    mean = torch.tensor(t.mean, dtype=torch.float64)[:, None, None]
    x = (x - mean) / torch.tensor(t.std, dtype=torch.float64)[:, None, None]
    torch.testing.assert_close(im.apply_affine(img, m, b), x.float(), atol=1e-4, rtol=1e-5)


def test_pca_lighting_statistics():
    """The pipeline's lighting offsets: along each ImageNet eigenvector a zero-mean normal with
    std pca_noise * eigenvalue, the three uncorrelated, and no change of the colour matrix."""
    t = ImageTransform(brightness=0, saturation=0, hue=0, pca_noise=0.1, mean=(0, 0, 0),
                       std=(1, 1, 1))
    torch.manual_seed(0)
    draws = [t.color_affine() for _ in range(4000)]
    assert all(torch.equal(m, torch.eye(3)) for m, _ in draws)
    offsets = torch.stack([b for _, b in draws]).to(torch.float64)
    vec = torch.tensor(im.IMAGENET_EIGVEC, dtype=torch.float64)
    along = offsets @ vec  # the eigenvector columns are orthonormal: project back
    expected = torch.tensor(im.IMAGENET_EIGVAL, dtype=torch.float64) * 0.1
    assert torch.allclose(along.std(0), expected, rtol=0.06)
    assert (along.mean(0).abs() < 4 * expected / len(draws) ** 0.5).all()
    corr = torch.corrcoef(along.T)
    assert (corr - torch.eye(3, dtype=torch.float64)).abs().max() < 0.06


def test_train_and_val_transforms():
    img = torch.randint(0, 256, (3, 40, 60), dtype=torch.uint8)
    t = ImageTransform(size=16)
    torch.manual_seed(1)
    a = t(img)
    torch.manual_seed(1)
    assert torch.equal(a, t(img)) and a.shape == (3, 16, 16)
    v = t.evaluation()(img)
    assert v.shape == (3, 16, 16)
    # val: shorter side to 16*256/224 = 18, centre crop: the middle of the resized image
    resized = im.resize(img, 18, 27)
    mean = torch.tensor(t.mean)[:, None, None]
    std = torch.tensor(t.std)[:, None, None]
    torch.testing.assert_close(v, (resized[:, 1:17, 6:22].float() - mean) / std)


def test_bad_settings_are_one_line_errors():
    for kw, msg in [({"size": 0}, "image size"), ({"scale": (0.5, 0.1)}, "crop scale"),
                    ({"hue": 2.0}, "hue"), ({"brightness": -1}, "brightness")]:
        with pytest.raises(ConfigError, match=msg):
            ImageTransform(**kw)


def test_torchvision_kernels_agree_with_tensor_kernels(monkeypatch):
    tv = im._tv()
    if tv is None:
        pytest.skip("torchvision.transforms.v2 does not import beside this torch")
    img = torch.randint(0, 256, (3, 50, 70), dtype=torch.uint8)
    with_tv = im.resized_crop(img, 3, 5, 30, 40, 24)
    monkeypatch.setattr(im, "_tv", lambda: None)
    assert torch.equal(with_tv, im.resized_crop(img, 3, 5, 30, 40, 24))
    assert math.isfinite(float(with_tv.float().mean()))
