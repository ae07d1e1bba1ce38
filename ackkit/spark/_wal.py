"""The write-ahead log of handed-out batches, kept inside the query's checkpoint.

One Arrow IPC file per batch, `batch-<start>-<end>.arrow`, written (and
fsynced) before the source tells Spark the batch exists; the rows in it are
exactly what Spark got, plus each row's deduplication key. A replayed batch
is read back from here, so it has the same rows whatever the broker does in
between. `state.json` holds how far the output is known to be written.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc

_NAME = re.compile(r"^batch-(\d+)-(\d+)\.arrow$")


class WalError(RuntimeError):
    """The write-ahead log lacks a batch Spark asks for, or contradicts the offsets."""


class WriteAheadLog:
    """Batches (start, end] of one source, as files in `directory`."""

    def __init__(self, directory: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.dir = Path(directory)
        self.fsync = fsync

    def create(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)

    def _path(self, start: int, end: int) -> Path:
        return self.dir / f"batch-{start:020d}-{end:020d}.arrow"

    def batches(self) -> list[tuple[int, int]]:
        """Every (start, end) in the log, oldest first."""
        if not self.dir.is_dir():
            return []
        out = []
        for name in os.listdir(self.dir):
            m = _NAME.match(name)
            if m:
                out.append((int(m[1]), int(m[2])))
        return sorted(out)

    def write(self, start: int, end: int, batch: pa.RecordBatch) -> None:
        """Durably add batch (start, end]: a temporary file, fsync, rename, fsync the directory."""
        self.create()
        fd, tmp = tempfile.mkstemp(prefix=".tmp-batch-", dir=self.dir)
        try:
            with os.fdopen(fd, "wb") as raw:
                with pa.ipc.new_file(raw, batch.schema) as w:
                    w.write_batch(batch)
                raw.flush()
                if self.fsync:
                    os.fsync(raw.fileno())
            os.replace(tmp, self._path(start, end))
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        self._sync_dir()

    def read(self, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """The batches covering exactly (start, end], in order."""
        pos = start
        for s, e in self.batches():
            if e <= start or s >= end:
                continue
            if s != pos or e > end:
                break
            # Read into memory (not a memory map): the batches outlive this generator.
            reader = pa.ipc.open_file(pa.py_buffer(self._path(s, e).read_bytes()))
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)
            pos = e
        if pos != end:
            raise WalError(
                f"the write-ahead log in {self.dir} has no batch covering offsets ({pos}, {end}]; "
                "was the checkpoint directory changed or partly deleted?"
            )

    def keys(self, start: int, end: int, column: str) -> list[str | None]:
        out: list[str | None] = []
        for b in self.read(start, end):
            out.extend(b.column(column).to_pylist())
        return out

    def starting_at(self, start: int) -> tuple[int, int] | None:
        for s, e in self.batches():
            if s == start:
                return s, e
        return None

    def prune(self, upto: int, keep: int) -> list[tuple[int, int]]:
        """Delete batches with end <= upto, except the newest `keep` of them. Returns those."""
        old = [b for b in self.batches() if b[1] <= upto]
        doomed = old[: max(len(old) - keep, 0)]
        for s, e in doomed:
            self._path(s, e).unlink(missing_ok=True)
        return doomed

    def wipe(self) -> None:
        for s, e in self.batches():
            self._path(s, e).unlink(missing_ok=True)
        (self.dir / "state.json").unlink(missing_ok=True)

    # -- how far the output is written ------------------------------------------------

    def written_upto(self) -> int:
        try:
            data = json.loads((self.dir / "state.json").read_text())
        except FileNotFoundError:
            return 0
        return int(data.get("written_upto", 0))

    def set_written_upto(self, end: int) -> None:
        self.create()
        target = self.dir / "state.json"
        tmp = self.dir / ".tmp-state.json"
        with open(tmp, "w") as f:
            json.dump({"written_upto": end}, f)
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        os.replace(tmp, target)
        self._sync_dir()

    def _sync_dir(self) -> None:
        if not self.fsync:
            return
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
