"""Where the source keeps its files: a local directory or an object store.

A `Store` is one directory of small files that are each written once under their
final name and never changed (the write-ahead log's batches, its "written up to"
markers) plus reads of Spark's own checkpoint files. Two kinds:

* local (a path, or `file:`): plain file I/O; a file is written to a hidden
  temporary name, fsynced, renamed into place, and the directory fsynced.
* anything else goes through `pyarrow.fs` (`s3://` / `s3a://` / `s3n://`, `gs://`,
  `abfs://` / `abfss://`, `hdfs://`; `fsspec`, when installed, for other schemes). On
  S3, GCS and Azure an object becomes visible only whole, when its upload completes,
  so it is written straight under its final name: no rename is needed (those stores
  have none). Other file systems (HDFS, fsspec) get the temporary-name-and-move dance.

Readers list names matching their own pattern, so a temporary or foreign file is
never mistaken for a log entry. Query parameters of a URI (e.g.
`?endpoint_override=127.0.0.1:9000&scheme=http` for an S3-compatible server) are kept
when a child location is derived, so executors reach the same store.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .._connection.url import mask_url

# Schemes pyarrow knows under another name (Hadoop's S3 connectors).
_ALIASES = {"s3a": "s3", "s3n": "s3"}
_WHOLE_OBJECTS = {"s3", "gs", "gcs", "abfs", "abfss", "az"}


def is_local(location: str) -> bool:
    scheme = urlsplit(location).scheme
    return scheme in ("", "file") or (len(scheme) == 1 and sys.platform == "win32")


def normalize_location(location: str | os.PathLike[str]) -> str:
    """The canonical text of a location: a local path made absolute and real, a URI as
    given without a trailing slash. Driver and runner derive the same IPC address from it."""
    text = os.fspath(location)
    if is_local(text):
        parts = urlsplit(text)
        path = parts.path if parts.scheme == "file" else text
        return os.path.realpath(os.path.expanduser(path))
    parts = urlsplit(text)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/")))


KNOWN_SCHEMES = {"s3", "s3a", "s3n", "gs", "gcs", "abfs", "abfss", "az", "hdfs", "viewfs"}


def check_location(location: str) -> str:
    """`location` normalized, or ValueError when no file-system layer here can open it."""
    text = normalize_location(location)
    scheme = urlsplit(text).scheme
    if is_local(text) or scheme in KNOWN_SCHEMES:
        return text
    try:
        import fsspec  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError:
        fsspec = None
    if fsspec is not None and scheme in fsspec.available_protocols():
        return text
    raise ValueError(
        f"{masked(text)!r}: no file-system layer for {scheme!r}:// here (pyarrow.fs knows "
        + ", ".join(sorted(KNOWN_SCHEMES))
        + "; other schemes need fsspec and its implementation)"
    )


def child_location(location: str, *names: str) -> str:
    """`location/name/...`, keeping a URI's query."""
    if is_local(location):
        return os.path.join(location, *names)
    parts = urlsplit(location)
    path = "/".join([parts.path.rstrip("/"), *names])
    return urlunsplit(parts._replace(path=path))


def masked(location: str) -> str:
    """A location fit for logs and errors (a password in the URI is masked)."""
    return location if is_local(location) else mask_url(location)


def _remote(location: str) -> tuple[Any, str, bool]:
    """(pyarrow FileSystem, path in it, whether uploads appear whole)."""
    import pyarrow.fs as pafs

    parts = urlsplit(location)
    scheme = _ALIASES.get(parts.scheme, parts.scheme)
    uri = urlunsplit(parts._replace(scheme=scheme))
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except Exception as exc:  # pyarrow does not know the scheme (or lacks the library)
        try:
            import fsspec  # type: ignore[import-untyped, import-not-found, unused-ignore]
        except ImportError:
            raise ValueError(
                f"cannot open {masked(location)!r} with pyarrow.fs ({exc}); install fsspec "
                "and the scheme's implementation, or use a local path"
            ) from None
        ffs, path = fsspec.core.url_to_fs(uri)
        fs = pafs.PyFileSystem(pafs.FSSpecHandler(ffs))
        return fs, str(path), False
    return fs, str(path), scheme in _WHOLE_OBJECTS


class Store:
    """One directory of write-once files, local or remote (see the module doc)."""

    def __init__(self, location: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.location = normalize_location(location)
        self.fsync = fsync
        self.local = is_local(self.location)
        self._fs: Any = None
        self._root = self.location
        self._whole = False
        if not self.local:
            self._fs, self._root, self._whole = _remote(self.location)

    def __repr__(self) -> str:
        return f"Store({masked(self.location)!r})"

    def child(self, *names: str) -> Store:
        return Store(child_location(self.location, *names), fsync=self.fsync)

    def _path(self, name: str) -> str:
        if self.local:
            return os.path.join(self.location, name)
        return f"{self._root.rstrip('/')}/{name}"

    # -- reading ------------------------------------------------------------------------

    def names(self) -> list[str]:
        """The names of the files directly in this directory ([] when it does not exist)."""
        if self.local:
            try:
                return os.listdir(self.location)
            except (FileNotFoundError, NotADirectoryError):
                return []
        import pyarrow.fs as pafs

        sel = pafs.FileSelector(self._root, recursive=False, allow_not_found=True)
        return [
            info.base_name
            for info in self._fs.get_file_info(sel)
            if info.type == pafs.FileType.File
        ]

    def read(self, name: str) -> bytes:
        """A file's bytes; FileNotFoundError when it does not exist."""
        if self.local:
            return Path(self._path(name)).read_bytes()
        try:
            with self._fs.open_input_stream(self._path(name)) as f:
                return bytes(f.read())
        except FileNotFoundError:
            raise
        except OSError as exc:
            if "not found" in str(exc).lower() or "does not exist" in str(exc).lower():
                raise FileNotFoundError(f"{masked(self.location)}/{name}") from None
            raise

    # -- writing ------------------------------------------------------------------------

    def create(self) -> None:
        if self.local:
            os.makedirs(self.location, exist_ok=True)
        elif not self._whole:
            self._fs.create_dir(self._root, recursive=True)
        # Object stores have no directories: the first object makes the prefix.

    def put(self, name: str, data: bytes) -> None:
        """Write `name` so that a reader sees all of it or nothing of it."""
        if self.local:
            self._put_local(name, data)
        elif self._whole:
            with self._fs.open_output_stream(self._path(name)) as f:
                f.write(data)
        else:
            tmp = self._path(f".tmp-{name}-{uuid.uuid4().hex[:8]}")
            try:
                with self._fs.open_output_stream(tmp) as f:
                    f.write(data)
                self._fs.move(tmp, self._path(name))
            except BaseException:
                with contextlib.suppress(Exception):
                    self._fs.delete_file(tmp)
                raise

    def _put_local(self, name: str, data: bytes) -> None:
        self.create()
        fd, tmp = tempfile.mkstemp(prefix=f".tmp-{name}-", dir=self.location)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                if self.fsync:
                    os.fsync(f.fileno())
            os.replace(tmp, self._path(name))
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        if self.fsync:
            dfd = os.open(self.location, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    def delete(self, name: str) -> None:
        if self.local:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(name))
            return
        with contextlib.suppress(FileNotFoundError):
            self._fs.delete_file(self._path(name))
