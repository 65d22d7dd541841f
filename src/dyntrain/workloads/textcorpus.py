"""A real text corpus on every machine without a download: the Python standard library's source.

The ``*.py`` files under ``sysconfig.get_paths()["stdlib"]`` (the test suites and any installed
packages left out: about 730 files, 12 MB for CPython 3.11), in a fixed order (sorted by their
path relative to the root), tokenised by bytes (vocabulary 256). A file goes to the validation
split when a hash of its relative path says so (about one file in twenty), so the split does not
depend on which other files exist. Each split is one byte stream, the files back to back.

A training sample is a window of ``seq_len + 1`` bytes (inputs and next-byte targets) at offset
``i * seq_len`` of the training stream: sample ``i`` is the same on every worker, as the elastic
trainer's data set contract requires (``dyntrain.elastic.step.sampler`` picks the indices). The
windows are views into the stream, so the data set costs the stream's bytes and nothing more.

Every worker of a job must read the same corpus: the same Python version on every host (or the
same ``--corpus`` folder). ``TextCorpus.digest`` names its contents; the GPT workload prints it.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from dyntrain.errors import ConfigError, DataError

# folders whose files are not part of the corpus: installed packages and test suites
EXCLUDED = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test",
                      "__pycache__"})
VAL_EVERY = 20  # about one file in VAL_EVERY is validation data
VOCAB = 256  # byte-level tokens


@dataclass(frozen=True)
class TextCorpus:
    """Training and validation byte streams (``uint8``) and what they were read from."""

    root: Path
    train: torch.Tensor
    val: torch.Tensor
    train_files: int
    val_files: int
    digest: str  # sha256 of the relative paths and contents, shortened

    def describe(self) -> str:
        """One line: where the corpus comes from, its size and its digest."""
        return (f"corpus {self.root}: {self.train_files} training files "
                f"({self.train.numel():,} bytes), {self.val_files} validation files "
                f"({self.val.numel():,} bytes), digest {self.digest}")


def stdlib_root() -> Path:
    """The folder of this interpreter's standard library sources."""
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(root: Path) -> list[Path]:
    """The ``*.py`` files under ``root`` outside ``EXCLUDED`` folders, sorted by relative path."""
    found = []
    for folder, subfolders, names in os.walk(root):  # pruned: site-packages can be large
        subfolders[:] = [d for d in subfolders if d not in EXCLUDED]
        found += [Path(folder, name) for name in names if name.endswith(".py")]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def is_validation(relative: str) -> bool:
    """Whether the file at ``relative`` (a POSIX path under the root) is validation data."""
    return hashlib.blake2b(relative.encode(), digest_size=8).digest()[0] % VAL_EVERY == 0


def load_corpus(root: Path | str | None = None) -> TextCorpus:
    """Read the corpus under ``root`` (default: the standard library) into two byte streams.

    Args:
        root: A folder of ``*.py`` files (searched recursively); None: ``stdlib_root()``.

    Raises:
        DataError: ``root`` is not a folder, or it holds no training or no validation file.
    """
    root = Path(root) if root is not None else stdlib_root()
    if not root.is_dir():
        raise DataError(f"corpus folder {root} does not exist")
    digest = hashlib.sha256()
    parts: dict[bool, list[bytes]] = {False: [], True: []}
    for path in corpus_files(root):
        relative = path.relative_to(root).as_posix()
        data = path.read_bytes()
        digest.update(relative.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
        parts[is_validation(relative)].append(data)
    if not parts[False] or not parts[True]:
        raise DataError(f"corpus folder {root} has {len(parts[False])} training and "
                        f"{len(parts[True])} validation files of *.py; it needs both")
    return TextCorpus(root, _stream(parts[False]), _stream(parts[True]), len(parts[False]),
                      len(parts[True]), digest.hexdigest()[:16])


def byte_windows(stream: torch.Tensor, seq_len: int) -> TensorDataset:
    """The samples of ``stream``: window ``i`` is bytes ``[i * seq_len, (i + 1) * seq_len]``
    (``seq_len + 1`` bytes: inputs and their next-byte targets), as views into the stream.

    Args:
        stream: A 1-D ``uint8`` tensor.
        seq_len: Tokens per sample.

    Raises:
        ConfigError: ``seq_len`` is below 1 or the stream holds not even one window.
    """
    if seq_len < 1:
        raise ConfigError(f"seq_len must be positive, got {seq_len}")
    count = (stream.numel() - 1) // seq_len
    if count < 1:
        raise ConfigError(f"a stream of {stream.numel()} bytes holds no window of "
                          f"{seq_len + 1} bytes: choose a shorter sequence length")
    return TensorDataset(stream.as_strided((count, seq_len + 1), (seq_len, 1)))


def _stream(files: list[bytes]) -> torch.Tensor:
    return torch.frombuffer(bytearray(b"".join(files)), dtype=torch.uint8)
