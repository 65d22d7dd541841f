"""Decoding and the article's augmentations, as a map-style image data set.

Training: random resized crop (area in ``scale``, aspect ratio in [3/4, 4/3]), horizontal flip,
then MXNet's colour jitter (brightness, saturation, hue by a YIQ rotation), AlexNet's PCA lighting
noise with the ImageNet eigenvalues/eigenvectors, and normalisation by the data set mean/std.
Validation: resize the shorter side, centre crop, normalise.

The colour steps are linear in RGB (MXNet applies them to float pixels without clipping), so
together with the lighting offset and the normalisation they fold into one affine map per sample,
``x -> M x + b``, applied in a single matrix product: the same numbers as applying them one by
one, at a fraction of the cost. Crop, resize and flip run on uint8 images with torch's
antialiased bilinear kernel; where ``torchvision.transforms.v2`` imports, its functional kernels
run instead (they call the same torch kernel, so results agree).

All randomness comes from torch's global generator, which the chunk loader seeds per sample from
(seed, step, chunk, position): the same image gets the same augmentation in any process.
"""

from __future__ import annotations

import io
import math
import warnings
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import simplejpeg
import torch
from PIL import Image, UnidentifiedImageError
from torch.nn import functional as F

from dyntrain.data.sources import ImageFolder, PackedShards, open_source
from dyntrain.errors import ConfigError, DataError

# AlexNet's PCA of ImageNet RGB pixels (0-255 scale), as used by fb.resnet.torch and MXNet.
IMAGENET_EIGVAL = (55.46, 4.794, 1.148)
IMAGENET_EIGVEC = ((-0.5675, 0.7192, 0.4009),
                   (-0.5808, -0.0045, -0.8140),
                   (-0.5836, -0.6948, 0.4203))
IMAGENET_MEAN = (123.68, 116.779, 103.939)
IMAGENET_STD = (58.393, 57.12, 57.375)
_GRAY = (0.299, 0.587, 0.114)
_TYIQ = ((0.299, 0.587, 0.114), (0.596, -0.274, -0.321), (0.211, -0.523, 0.311))
_ITYIQ = ((1.0, 0.956, 0.621), (1.0, -0.272, -0.647), (1.0, -1.107, 1.705))
_EYE = ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0))
Matrix = tuple[tuple[float, float, float], ...]


@dataclass(frozen=True)
class ImageTransform:
    """The augmentation settings (defaults: the ResNet-50 article's MXNet pipeline).

    Called on a decoded uint8 image ``[3, H, W]``, it returns a float32 ``[3, size, size]``
    tensor, normalised. Its randomness comes from torch's generator only, which the loader seeds
    per sample, so the same sample of the same step gives the same pixels on any worker.

    Args:
        size: Side of the square output, in pixels.
        train: Random augmentation (True) or the validation transform (shorter side to
            ``val_resize``, centre crop).
        scale: Range of the random crop's area, as fractions of the image's (0 < min <= max
            <= 1).
        ratio: Range of the random crop's aspect ratio (width / height).
        flip: Flip horizontally with probability 1/2.
        brightness: Brightness jitter: a factor drawn from [1 - b, 1 + b].
        saturation: Saturation jitter, likewise.
        hue: Hue jitter, as a fraction of half a turn, in [0, 1].
        pca_noise: Standard deviation of the PCA lighting noise (ImageNet's eigenvectors).
        mean: Per-channel mean subtracted after scaling to [0, 1].
        std: Per-channel standard deviation divided by.
        val_resize: Shorter side before the validation centre crop; default ``size * 256/224``.

    Raises:
        ConfigError: A value is out of range (one line, naming it).
    """

    size: int = 224
    train: bool = True
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = True
    brightness: float = 0.4
    saturation: float = 0.4
    hue: float = 0.4
    pca_noise: float = 0.1
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    val_resize: int | None = None  # shorter side before the centre crop; default size * 256/224

    def __post_init__(self) -> None:
        if self.size <= 0:
            raise ConfigError(f"image size must be positive, got {self.size}")
        if not 0 < self.scale[0] <= self.scale[1] <= 1:
            raise ConfigError(f"crop scale must satisfy 0 < min <= max <= 1, got {self.scale}")
        if not 0 < self.ratio[0] <= self.ratio[1]:
            raise ConfigError(f"aspect ratio range must be positive and ordered: {self.ratio}")
        for name in ("brightness", "saturation", "hue", "pca_noise"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.hue > 1:
            raise ConfigError(f"hue must be in [0, 1] (a fraction of half a turn), got {self.hue}")

    def evaluation(self) -> ImageTransform:
        """The validation transform of the same size and normalisation."""
        return ImageTransform(size=self.size, train=False, mean=self.mean, std=self.std,
                              val_resize=self.val_resize)

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        """uint8 [3, H, W] -> float32 [3, size, size], normalised."""
        if not self.train:
            return self._evaluate(img)
        u = torch.rand(23, dtype=torch.float64).tolist()
        top, left, h, w = crop_box(img.shape[1], img.shape[2], self.scale, self.ratio, u)
        out = resized_crop(img, top, left, h, w, self.size)
        if self.flip and u[22] < 0.5:
            out = horizontal_flip(out)
        m, b = self.color_affine()
        return apply_affine(out, m, b)

    def color_affine(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A random colour jitter + lighting + normalisation as (M [3, 3], b [3]), float32.

        The 3x3 algebra runs on Python floats (float64): building and multiplying small
        tensors would cost more than the arithmetic."""
        u = torch.rand(3, dtype=torch.float64).tolist()
        noise = torch.randn(3, dtype=torch.float64).tolist()
        m: Matrix = _EYE
        if self.brightness:
            c = 1 + self.brightness * (2 * u[0] - 1)
            m = tuple([(c * x, c * y, c * z) for x, y, z in m])
        if self.saturation:
            a = 1 + self.saturation * (2 * u[1] - 1)
            sat = tuple([tuple([a * e + (1 - a) * g for e, g in zip(row, _GRAY, strict=True)])
                         for row in _EYE])
            m = _matmul(sat, m)
        if self.hue:
            m = _matmul(_hue(self.hue * (2 * u[2] - 1)), m)
        offset = _lighting([n * self.pca_noise for n in noise])
        return _normalised(m, offset, self.mean, self.std)

    def _evaluate(self, img: torch.Tensor) -> torch.Tensor:
        h, w = img.shape[1], img.shape[2]
        short = self.val_resize or round(self.size * 256 / 224)
        nh, nw = (short, max(1, round(w * short / h))) if h <= w else (
            max(1, round(h * short / w)), short)
        out = resize(img, nh, nw)
        top, left = int(round((nh - self.size) / 2)), int(round((nw - self.size) / 2))
        if top < 0 or left < 0:
            raise ConfigError(f"val_resize {short} is smaller than the crop {self.size}")
        out = out[:, top:top + self.size, left:left + self.size]
        m, b = _normalised(_EYE, (0.0, 0.0, 0.0), self.mean, self.std)
        return apply_affine(out, m, b)


def crop_box(h: int, w: int, scale, ratio, u: list[float]) -> tuple[int, int, int, int]:
    """RandomResizedCrop's box (top, left, height, width) from uniforms ``u`` (>= 22 values):
    up to 10 tries of (area, log-aspect), then the centre crop clamped to ``ratio``."""
    area, lo, hi = h * w, math.log(ratio[0]), math.log(ratio[1])
    for k in range(10):
        target = area * (scale[0] + (scale[1] - scale[0]) * u[2 * k])
        aspect = math.exp(lo + (hi - lo) * u[2 * k + 1])
        cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            return int(u[20] * (h - ch + 1)), int(u[21] * (w - cw + 1)), ch, cw
    if w / h < ratio[0]:
        cw, ch = w, int(round(w / ratio[0]))
    elif w / h > ratio[1]:
        ch, cw = h, int(round(h * ratio[1]))
    else:
        ch, cw = h, w
    return (h - ch) // 2, (w - cw) // 2, ch, cw


def _matmul(a: Matrix, b: Matrix) -> Matrix:
    c0, c1, c2 = zip(*b, strict=True)  # columns
    return tuple([(x * c0[0] + y * c0[1] + z * c0[2], x * c1[0] + y * c1[1] + z * c1[2],
                   x * c2[0] + y * c2[1] + z * c2[2]) for x, y, z in a])


def _hue(alpha: float) -> Matrix:
    c, s = math.cos(alpha * math.pi), math.sin(alpha * math.pi)
    return _matmul(_matmul(_ITYIQ, ((1.0, 0.0, 0.0), (0.0, c, -s), (0.0, s, c))), _TYIQ)


def _lighting(alpha) -> tuple[float, float, float]:
    scaled = [a * e for a, e in zip(alpha, IMAGENET_EIGVAL, strict=True)]
    return tuple(sum(v * x for v, x in zip(row, scaled, strict=True)) for row in IMAGENET_EIGVEC)


def hue_matrix(alpha: float) -> torch.Tensor:
    """MXNet's hue jitter: rotate the I/Q plane of YIQ by ``alpha`` half turns."""
    return torch.tensor(_hue(alpha), dtype=torch.float64)


def lighting_offset(alpha: torch.Tensor) -> torch.Tensor:
    """AlexNet's PCA lighting: the RGB offset eigvec @ (alpha * eigval), 0-255 scale."""
    return torch.tensor(_lighting(alpha.tolist()), dtype=torch.float64)


def _normalised(m: Matrix, offset, mean, std) -> tuple[torch.Tensor, torch.Tensor]:
    inv = [1.0 / s for s in std]
    b = [(o - mu) * i for o, mu, i in zip(offset, mean, inv, strict=True)]
    return (torch.tensor([[i * v for v in row] for i, row in zip(inv, m, strict=True)],
                         dtype=torch.float32), torch.tensor(b, dtype=torch.float32))


def apply_affine(img: torch.Tensor, m: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """uint8 [3, H, W] -> float32 ``M x + b`` per pixel, one matrix product."""
    c, h, w = img.shape
    x = img.permute(1, 2, 0).reshape(h * w, c).to(torch.float32)
    out = torch.addmm(b, x, m.t())  # [HW, 3], rows are pixels
    return out.view(h, w, c).permute(2, 0, 1).contiguous()


@lru_cache(maxsize=1)
def _tv():
    """torchvision.transforms.v2.functional where it imports beside this torch, else None."""
    try:
        from torchvision.transforms.v2 import functional
    except Exception:  # not installed, or built for another torch: the tensor kernels serve
        return None
    return functional


def resize(img: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """uint8 [3, H, W] -> [3, h, w], antialiased bilinear."""
    tv = _tv()
    if tv is not None:
        return tv.resize(img, [h, w], antialias=True)
    x = img.unsqueeze(0).contiguous(memory_format=torch.channels_last)
    return F.interpolate(x, size=(h, w), mode="bilinear", antialias=True,
                         align_corners=False)[0]


def resized_crop(img: torch.Tensor, top: int, left: int, h: int, w: int,
                 size: int) -> torch.Tensor:
    tv = _tv()
    if tv is not None:
        return tv.resized_crop(img, top, left, h, w, [size, size], antialias=True)
    return resize(img[:, top:top + h, left:left + w], size, size)


def horizontal_flip(img: torch.Tensor) -> torch.Tensor:
    tv = _tv()
    return tv.horizontal_flip(img) if tv is not None else img.flip(-1)


def decode(data: bytes, name: str) -> torch.Tensor:
    """JPEG/PNG bytes -> uint8 [3, H, W] (RGB; a channels-last view of the decoded pixels).

    YCbCr and grey JPEGs go to libjpeg-turbo through simplejpeg (the same pixels as PIL, which
    costs many times the decoding per image for small ones); PIL takes the rest (PNG, CMYK
    JPEGs, whose RGB conversion differs) and names what is wrong with a file it cannot read."""
    if data[:2] == b"\xff\xd8":
        try:
            if simplejpeg.decode_jpeg_header(data)[2] in ("YCbCr", "Gray"):
                arr = simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)
                return torch.from_numpy(arr).permute(2, 0, 1)
        except ValueError:  # corrupt: PIL says what is wrong
            pass
    return _decode_pil(data, name)


def _decode_pil(data: bytes, name: str) -> torch.Tensor:
    try:
        with Image.open(io.BytesIO(data)) as im:
            arr = np.asarray(im.convert("RGB"))
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise DataError(f"cannot decode image {name}: {exc}") from None
    with warnings.catch_warnings():
        # read-only memory: the transforms only read the decoded image (no copy of it)
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr).permute(2, 0, 1)


class ImageDataset(torch.utils.data.Dataset):
    """A map-style data set of (normalised float image, label) from an image source.

    Args:
        source: An image folder (``root/<class>/<image>.jpg``), packed shards (a folder with
            the ``index.json`` that ``dyntrain data pack`` writes), as a local path or an fsspec
            URL; or an opened ``ImageFolder`` / ``PackedShards``.
        transform: Applied to every decoded image (``ImageTransform(...)`` for training,
            ``.evaluation()`` for validation).

    Raises:
        DataError: The source cannot be opened (one line, naming it). A sample that cannot
            be read or decoded raises ``DataError`` when it is read.
    """

    def __init__(self, source: str | ImageFolder | PackedShards,
                 transform: ImageTransform) -> None:
        self.source = open_source(source) if isinstance(source, str) else source
        self.transform = transform
        self.classes = self.source.classes

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        rec = self.source.read(index)
        return self.transform(decode(rec.data, rec.name)), rec.label
