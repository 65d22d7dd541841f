"""Where a run folder lives: a local folder or an object store (any fsspec URL), one interface.

A run folder is a handful of named files (``run.json``, ``checkpoints/ckpt-000000012.dtck``,
...). A ``RunStore`` puts a whole file atomically (a reader sees the old content or the new,
never a part), gets one (or a byte range of one), lists a folder's files and deletes files.
Locally a file goes to a temporary name, is synced and renamed (``atomic_write_bytes``); on an
object store one PUT is atomic by itself. What object stores cannot do, append to a file or
rename one, is handled a layer up: line files become numbered segments (``linelog``), a
checkpoint becomes parts plus a commit record written last (``ckptstore``).

Credentials and endpoints come from the file system library's standard mechanisms: for ``s3://``
(s3fs over botocore) ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_PROFILE`` /
``~/.aws`` / an instance role, and ``AWS_ENDPOINT_URL`` for an S3-compatible server; for any
protocol, fsspec's ``FSSPEC_<PROTOCOL>`` (JSON storage options, e.g. ``FSSPEC_S3='{"client_kwargs":
{"endpoint_url": "http://10.0.0.5:9000"}}'``). A store that cannot be used (no such bucket,
credentials refused, endpoint unreachable) raises ``StorageError``: one line naming the URL.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dyntrain.errors import DyntrainError
from dyntrain.outdir import make_out_dir


class StorageError(DyntrainError):
    """A run folder's storage cannot be used; the message names the URL and the cause."""


def is_url(location: str | os.PathLike) -> bool:
    """True for a remote fsspec URL (``s3://b/p``, ``memory://x``); False for a local path or a
    ``file://`` URL."""
    text = str(location)
    return "://" in text and not text.startswith("file://")


def open_store(location: str | os.PathLike, what: str | None = None) -> RunStore:
    """The run store at a local path, a ``file://`` URL or any other fsspec URL.

    Args:
        location: where the run folder is, as the user gave it (``--out``, ``DYNTRAIN_OUT``).
        what: where the location came from (``--out``, ``DYNTRAIN_OUT``); when given, a local
            folder is created now, and one that cannot be is a ``ConfigError`` naming it.
    """
    text = os.fspath(location)
    if is_url(text):
        return FsspecStore(text)
    folder = Path(text.removeprefix("file://"))
    return LocalStore(make_out_dir(folder, what) if what is not None else folder)


def parent_and_name(ref: str) -> tuple[str, str]:
    """Split a file's full location (path or URL) into its run folder and its name there,
    given that the name has one folder level (``checkpoints/ckpt-...``)."""
    folder, _, name = ref.rstrip("/").rpartition("/")
    root, _, sub = folder.rpartition("/")
    return root, f"{sub}/{name}"


class RunStore(ABC):
    """Files of one run folder, named relative to it with ``/`` between folders."""

    #: the folder as the user named it (a path or a URL), for messages and for other processes
    location: str
    #: the local folder, or None for an object store
    local: Path | None = None

    def where(self, name: str) -> str:
        """The full location of ``name`` (a path or a URL), as shown to users."""
        return f"{self.location.rstrip('/')}/{name}"

    @abstractmethod
    def check(self) -> None:
        """Raise ``StorageError`` now if the folder cannot be used (say, no such bucket)."""

    @abstractmethod
    def put(self, name: str, data: bytes) -> None:
        """Write ``name`` whole and atomically, replacing any earlier content."""

    def put_many(self, files: dict[str, bytes]) -> None:
        """Write several files (concurrently where the store can); each one atomically."""
        for name, data in files.items():
            self.put(name, data)

    @abstractmethod
    def get(self, name: str, start: int | None = None, end: int | None = None) -> bytes:
        """The content of ``name`` (bytes ``start`` to ``end`` when given); raises
        ``FileNotFoundError`` when there is no such file."""

    def get_many(self, names: list[str]) -> dict[str, bytes | Exception]:
        """Several files' content (concurrently where the store can); a file that cannot be
        read maps to its exception."""
        out: dict[str, bytes | Exception] = {}
        for name in names:
            try:
                out[name] = self.get(name)
            except (OSError, StorageError) as exc:
                out[name] = exc
        return out

    @abstractmethod
    def list(self, folder: str = "") -> dict[str, int]:
        """The files directly in ``folder`` as ``{name: size in bytes}`` (names include the
        folder); a missing folder has none."""

    @abstractmethod
    def list_folders(self, folder: str = "") -> list[str]:
        """The folders directly in ``folder``, by name (including ``folder``); a missing
        folder has none."""

    @abstractmethod
    def delete(self, names: Iterable[str]) -> None:
        """Remove files; one that is already gone is no error."""

    def exists(self, name: str) -> bool:
        folder, _, _ = name.rpartition("/")
        return name in self.list(folder)


class LocalStore(RunStore):
    """A run folder on a local (or shared) file system: the layout dyntrain always used.

    Args:
        root: the folder; created when the first file is written.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.local = self.root
        self.location = str(self.root)

    def check(self) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise StorageError(f"{self.root} is a file, not a run folder")

    def put(self, name: str, data: bytes) -> None:
        from dyntrain.elastic.runs.checkpoint_file import (
            atomic_write_bytes,  # torch: not for is_url()
        )

        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, data)

    def get(self, name: str, start: int | None = None, end: int | None = None) -> bytes:
        with open(self.root / name, "rb") as f:
            if start:
                f.seek(start)
            return f.read() if end is None else f.read(max(0, end - (start or 0)))

    def list(self, folder: str = "") -> dict[str, int]:
        found = {}
        try:
            with os.scandir(self.root / folder) as entries:
                for entry in entries:
                    try:
                        if entry.is_file():
                            found[f"{folder}/{entry.name}" if folder else entry.name] = \
                                entry.stat().st_size
                    except FileNotFoundError:  # removed since the listing began
                        continue
        except (FileNotFoundError, NotADirectoryError):
            return {}
        return found

    def list_folders(self, folder: str = "") -> list[str]:
        try:
            with os.scandir(self.root / folder) as entries:
                return sorted(f"{folder}/{e.name}" if folder else e.name for e in entries
                              if e.is_dir())
        except (FileNotFoundError, NotADirectoryError):
            return []

    def delete(self, names: Iterable[str]) -> None:
        for name in names:
            (self.root / name).unlink(missing_ok=True)

    def exists(self, name: str) -> bool:
        return (self.root / name).is_file()


class FsspecStore(RunStore):
    """A run folder on an object store (or any file system fsspec reaches) by its URL.

    Args:
        url: ``s3://bucket/prefix`` or any fsspec URL; options come from the environment
            (see the module's docstring).
    """

    def __init__(self, url: str) -> None:
        import fsspec

        self.location = url.rstrip("/")
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.location)
        except ImportError as exc:
            extra = " (pip install 'dyntrain[s3]')" if url.startswith("s3") else ""
            raise StorageError(f"{url}: {exc}{extra}") from None
        except (ValueError, TypeError) as exc:
            raise StorageError(f"{url}: not a usable storage URL ({exc})") from None
        self.root = self.root.rstrip("/")

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}" if name else self.root

    def check(self) -> None:
        with self._errors("read"):
            try:
                self.fs.invalidate_cache(self.root)
                self.fs.ls(self.root)
                return
            except FileNotFoundError:
                pass  # a new run folder; its bucket must exist
            top = self.root.split("/", 1)[0]
            if top != self.root:
                try:
                    self.fs.info(top)
                except FileNotFoundError:
                    raise StorageError(f"{self.location}: bucket {top!r} does not exist "
                                       f"(endpoint {self._endpoint()})") from None

    def put(self, name: str, data: bytes) -> None:
        with self._errors(f"write {name} to"):
            self.fs.pipe_file(self._path(name), data)

    def put_many(self, files: dict[str, bytes]) -> None:
        with self._errors(f"write {len(files)} files to"):
            self.fs.pipe({self._path(n): d for n, d in files.items()})

    def get(self, name: str, start: int | None = None, end: int | None = None) -> bytes:
        with self._errors(f"read {name} from"):
            return self.fs.cat_file(self._path(name), start=start, end=end)

    def get_many(self, names: list[str]) -> dict[str, bytes | Exception]:
        if not names:
            return {}
        with self._errors(f"read {len(names)} files from"):
            got = self.fs.cat([self._path(n) for n in names], on_error="return")
        return {n: got.get(self._path(n), FileNotFoundError(n)) for n in names}

    def list(self, folder: str = "") -> dict[str, int]:
        path = self._path(folder)
        with self._errors("list"):
            self.fs.invalidate_cache(path)  # another process may have written since
            try:
                entries = self.fs.ls(path, detail=True)
            except FileNotFoundError:
                return {}
        start = len(self.root) + 1
        return {e["name"][start:]: int(e.get("size") or 0) for e in entries
                if e.get("type") == "file" and e["name"].startswith(self.root + "/")}

    def list_folders(self, folder: str = "") -> list[str]:
        path = self._path(folder)
        with self._errors("list"):
            self.fs.invalidate_cache(path)
            try:
                entries = self.fs.ls(path, detail=True)
            except FileNotFoundError:
                return []
        start = len(self.root) + 1
        return sorted(e["name"].rstrip("/")[start:] for e in entries
                      if e.get("type") == "directory" and e["name"].startswith(self.root + "/"))

    def delete(self, names: Iterable[str]) -> None:
        paths = [self._path(n) for n in names]
        if not paths:
            return
        with self._errors("delete files in"):
            try:
                self.fs.rm(paths)
            except FileNotFoundError:
                pass

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Turn the library's exceptions into one line naming the URL and the cause; a missing
        file stays ``FileNotFoundError`` (callers expect it)."""
        try:
            yield
        except (FileNotFoundError, StorageError):
            raise
        except PermissionError as exc:
            hint = ("; check the credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                    "AWS_PROFILE or the instance role)" if self._s3 else "")
            raise StorageError(f"cannot {what} {self.location}: access denied "
                               f"({_first_line(exc)}){hint}") from None
        except Exception as exc:  # the libraries raise many kinds: connection, HTTP, botocore
            raise StorageError(f"cannot {what} {self.location} (endpoint {self._endpoint()}): "
                               f"{type(exc).__name__}: {_first_line(exc)}") from None

    def _endpoint(self) -> str:
        """The server this store talks to, as far as it can tell."""
        kwargs = getattr(self.fs, "client_kwargs", None) or {}
        endpoint = (getattr(self.fs, "endpoint_url", None) or kwargs.get("endpoint_url")
                    or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"))
        if endpoint:
            return endpoint
        return "AWS's default" if self._s3 else "default"

    @property
    def _s3(self) -> bool:
        protocol = self.fs.protocol
        return (protocol if isinstance(protocol, str) else protocol[0]) in ("s3", "s3a")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
