"""TensorBoard event files for a run folder: the rows of ``metrics.jsonl`` and ``events.jsonl``
mirrored into ``tensorboard/`` through ``torch.utils.tensorboard.SummaryWriter``, on the same
step axis.

Each metrics row gives the scalars ``train/loss``, ``train/lr``, ``train/samples_per_s``,
``train/world_size`` (and ``train/grad_norm`` when reported), its validation fields as
``val/<name>`` (``val_accuracy`` -> ``val/accuracy``) and, when measured, the gradient noise
scale as ``noise/b_simple``, ``noise/b_simple_raw``, ``noise/g2``, ``noise/trace_sigma``; each
at the row's ``step`` with the row's ``time`` as wall time. Each membership change is a text
event under the tag ``membership`` at the step the new world started from.

One writer per run folder, closed with the run. A run resumed into the same folder adds a new
event file next to the earlier ones, and TensorBoard reads them as one run (a step computed
again after a crash is written again at its step: the same loss, the new world's size). On an
object store (``s3://...``) the event file is written to a local temporary folder and uploaded
to ``tensorboard/`` every ``UPLOAD_SECONDS``, at each membership change and when the run ends.

Whether it is on: ``wanted(None)`` (the default) is on when the ``tensorboard`` package can be
imported, off (silently) when it cannot; ``wanted(True)`` without the package raises
``MissingExtra`` (one line: ``pip install 'dyntrain[tensorboard]'``).
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from dyntrain.elastic.runs.rows import EventRow, MetricsRow
from dyntrain.elastic.runs.storage import RunStore, StorageError
from dyntrain.extras import MissingExtra

__all__ = ["FOLDER", "TensorBoardMirror", "available", "wanted"]

FOLDER = "tensorboard"
UPLOAD_SECONDS = 30.0  # how often an object store's event file is uploaded while a run goes


def available() -> bool:
    """Whether TensorBoard's package is installed (``SummaryWriter`` needs it)."""
    return importlib.util.find_spec("tensorboard") is not None


def _load_writer() -> None:
    """Import ``SummaryWriter``'s module ahead of its first use; a failure is raised by that
    use, which imports it again."""
    try:
        import torch.utils.tensorboard  # noqa: F401
    except Exception:  # raised where it is used
        pass


def wanted(setting: bool | None, what: str = "--tensorboard") -> bool:
    """Whether to write TensorBoard files: ``setting``, or (None) whether the package is there.

    Args:
        setting: True (asked for), False (turned off) or None (on when installed).
        what: how the user asked for it, for the error.

    Raises:
        MissingExtra: ``setting`` is True and the package is not installed.
    """
    if setting is None:
        return available()
    if setting and not available():
        raise MissingExtra("tensorboard", what)
    return setting


class TensorBoardMirror:
    """Writes one run folder's metrics and membership rows as TensorBoard events.

    Args:
        store: the run folder; the event files go to its ``tensorboard/`` folder.
        on_error: told (one line) when an object store refuses an upload.
    """

    def __init__(self, store: RunStore, on_error: Callable[[str], None] | None = None) -> None:
        if not available():  # missing: fail here, not at the first row
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401

        self.store, self.on_error = store, on_error
        self._scratch: Path | None = None
        self._writer = None
        self._uploaded = time.monotonic()
        # its import takes a second or two: made in the background (while a launcher's
        # workers start), the first row waits for it
        self._loading = threading.Thread(target=_load_writer, name="tensorboard-import",
                                         daemon=True)
        self._loading.start()

    @property
    def writer(self):
        """The event file's writer, made with the first row: a run refused before it trained
        (bad settings, another run's folder) leaves no file behind."""
        if self._writer is None:
            self._loading.join()
            from torch.utils.tensorboard import SummaryWriter

            if self.store.local is not None:
                folder = self.store.local / FOLDER
            else:
                self._scratch = folder = Path(tempfile.mkdtemp(prefix="dyntrain-tb-"))
            self._writer = SummaryWriter(log_dir=str(folder))
        return self._writer

    def metrics(self, row: MetricsRow) -> None:
        """Add the scalars of one applied step."""
        at = row.time
        scalars = {"train/loss": row.loss, "train/lr": row.lr,
                   "train/samples_per_s": row.samples_per_s,
                   "train/world_size": row.world_size, "train/grad_norm": row.grad_norm}
        if row.noise is not None:
            scalars.update({"noise/b_simple": row.noise.b_simple,
                            "noise/b_simple_raw": row.noise.b_simple_raw,
                            "noise/g2": row.noise.g2, "noise/trace_sigma": row.noise.trace_sigma})
        for name, value in row.validation.items():
            scalars[f"val/{name.removeprefix('val_')}"] = value
        for tag, value in scalars.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self.writer.add_scalar(tag, value, row.step, walltime=at)
        self._maybe_upload()

    def event(self, row: EventRow) -> None:
        """Add one membership change as a text event at the step its world started from."""
        self.writer.add_text("membership", row.text(), row.start_step or 0)
        self.writer.flush()  # rare and worth seeing at once
        self._maybe_upload(force=True)

    def close(self) -> None:
        """Write out the events, upload them (object store) and close the writer."""
        if self._writer is None:
            return
        self._writer.close()
        if self._scratch is not None:
            self._upload()
            shutil.rmtree(self._scratch, ignore_errors=True)

    def _maybe_upload(self, force: bool = False) -> None:
        if self._scratch is None:
            return
        if force or time.monotonic() - self._uploaded >= UPLOAD_SECONDS:
            self.writer.flush()
            self._upload()

    def _upload(self) -> None:
        self._uploaded = time.monotonic()
        files = {f"{FOLDER}/{path.name}": path.read_bytes()
                 for path in sorted(self._scratch.iterdir()) if path.is_file()}
        try:
            self.store.put_many(files)
        except (OSError, StorageError) as exc:
            if self.on_error is not None:
                self.on_error(f"cannot upload TensorBoard events to "
                              f"{self.store.where(FOLDER)}: {exc}")
