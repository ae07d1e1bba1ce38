"""The write-ahead log of handed-out batches, kept inside the query's checkpoint.

One Arrow IPC file per batch, `batch-<start>-<end>.arrow`, written whole before the
source tells Spark the batch exists; the rows in it are exactly what Spark got, plus
each row's deduplication key. A replayed batch is read back from here (by an
executor, on a cluster), so it has the same rows whatever the broker does in between.
How far the output is known to be written is a marker `written-<end>`, a new one per
batch (the newest wins), so no file is ever overwritten: the log works the same on a
local disk and on an object store without rename (see `_store`).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.ipc

from ._deploy import Owner, WalVerdict, wal_owner
from ._store import Store, masked

log = logging.getLogger("ackkit.spark")
_NAME = re.compile(r"^batch-(\d+)-(\d+)\.arrow$")
_WRITTEN = re.compile(r"^written-(\d+)$")
KEEP_MARKERS = 2
OWNER = "owner.json"


class WalError(RuntimeError):
    """The write-ahead log lacks a batch Spark asks for, or contradicts the offsets."""


class WriteAheadLog:
    """Batches (start, end] of one source, as files in a `Store` directory.

    `cache=True` (the source runner, the log's only writer) lists the directory once and
    then keeps the list itself; readers elsewhere (executors) list it on every read."""

    def __init__(
        self, location: str | os.PathLike[str] | Store, *, fsync: bool = True, cache: bool = False
    ) -> None:
        self.store = location if isinstance(location, Store) else Store(location, fsync=fsync)
        self._cache = cache
        self._known: list[tuple[int, int]] | None = None

    @property
    def location(self) -> str:
        return self.store.location

    def create(self) -> None:
        self.store.create()

    @staticmethod
    def _name(start: int, end: int) -> str:
        return f"batch-{start:020d}-{end:020d}.arrow"

    def batches(self) -> list[tuple[int, int]]:
        """Every (start, end) in the log, oldest first."""
        if self._known is not None:
            return list(self._known)
        out = []
        for name in self.store.names():
            m = _NAME.match(name)
            if m:
                out.append((int(m[1]), int(m[2])))
        out.sort()
        if self._cache:
            self._known = out
        return list(out)

    def write(self, start: int, end: int, batch: pa.RecordBatch) -> None:
        """Durably add batch (start, end] (all of it or nothing, see `Store.put`)."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, batch.schema) as w:
            w.write_batch(batch)
        self.store.put(self._name(start, end), sink.getvalue().to_pybytes())
        if self._known is not None:
            self._known = sorted({*self._known, (start, end)})

    def read(self, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """The batches covering exactly (start, end], in order."""
        pos = start
        for s, e in self.batches():
            if e <= start or s >= end:
                continue
            if s != pos or e > end:
                break
            reader = pa.ipc.open_file(pa.py_buffer(self.store.read(self._name(s, e))))
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)
            pos = e
        if pos != end:
            raise WalError(
                f"the write-ahead log in {masked(self.location)} has no batch covering offsets "
                f"({pos}, {end}]; was the checkpoint directory changed or partly deleted?"
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

    def _delete(self, name: str) -> bool:
        """Housekeeping: a file that cannot be deleted now is left for a later prune
        (a store refusing deletes must not stop acks)."""
        try:
            self.store.delete(name)
        except OSError as exc:
            log.warning("ackkit.spark: cannot delete %s from %s: %s", name, self.store, exc)
            return False
        return True

    def prune(self, upto: int, keep: int) -> list[tuple[int, int]]:
        """Delete batches with end <= upto, except the newest `keep` of them. Returns those
        deleted."""
        old = [b for b in self.batches() if b[1] <= upto]
        doomed = [
            (s, e) for s, e in old[: max(len(old) - keep, 0)] if self._delete(self._name(s, e))
        ]
        if doomed and self._known is not None:
            self._known = [b for b in self._known if b not in doomed]
        return doomed

    # -- which checkpoint the log belongs to (see `_deploy.wal_owner`) ------------------

    def owner(self) -> Owner | None:
        try:
            return Owner.from_json(json.loads(self.store.read(OWNER).decode()))
        except FileNotFoundError:
            return None

    def check_owner(self, me: Owner, *, checkpoint_has_offsets: bool) -> WalVerdict:
        """Whether the log may serve checkpoint `me` (`_deploy.wal_owner`; raises
        `DeploymentChanged` when it is another checkpoint's). Writes nothing."""
        return wal_owner(
            masked(self.location),
            me,
            self.owner(),
            has_batches=bool(self.batches()),
            checkpoint_has_offsets=checkpoint_has_offsets,
        )

    def claim(self, me: Owner, *, checkpoint_has_offsets: bool) -> None:
        """Record `me` as the log's owner, or raise `DeploymentChanged` when the log is
        another checkpoint's (before any of its batches is read)."""
        verdict = self.check_owner(me, checkpoint_has_offsets=checkpoint_has_offsets)
        if verdict is WalVerdict.CLAIM:
            self.store.put(OWNER, json.dumps(me.to_json()).encode())
            # Two queries claiming at once: the one whose claim did not stick stops here.
            wal_owner(
                masked(self.location),
                me,
                self.owner(),
                has_batches=True,
                checkpoint_has_offsets=checkpoint_has_offsets,
            )

    def wipe(self) -> None:
        for name in self.store.names():
            if _NAME.match(name) or _WRITTEN.match(name) or name in ("state.json", OWNER):
                self.store.delete(name)
        self._known = None

    # -- how far the output is written ------------------------------------------------

    def _markers(self) -> list[int]:
        return sorted(int(m[1]) for n in self.store.names() if (m := _WRITTEN.match(n)))

    def written_upto(self) -> int:
        marks = self._markers()
        try:  # the single overwritten file of earlier versions
            legacy = int(json.loads(self.store.read("state.json")).get("written_upto", 0))
        except FileNotFoundError:
            legacy = 0
        return max([legacy, *marks])

    def set_written_upto(self, end: int) -> None:
        """Record that the output holds every batch up to `end` (a new write-once marker,
        then the older markers are deleted)."""
        self.store.put(f"written-{end:020d}", b"")
        for old in self._markers()[:-KEEP_MARKERS]:
            if old < end:
                self._delete(f"written-{old:020d}")
