"""The map from a channel's delivery tags to a runtime's own objects.

The core knows a delivery by its channel generation and delivery tag; the actions it
decides name tags. Each runtime keeps here what a tag is to it, written once for all of
them (`Originals`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

from .._core.actions import Ack, Action, Nack, Reject, Republish

T = TypeVar("T")


KEPT_GENERATIONS = 4
"""Generations whose tags are kept (the current one and the last few before it)."""


class Originals(Generic[T]):
    """An executor's own objects for the deliveries its core tracks, by delivery tag.

    The core knows deliveries by channel generation and delivery tag only; the actions
    it decides name tags (`Start(tag)`, `Republish(tag=...)`). Each executor keeps here
    what a tag is to it (a `Delivery`, or the Spark source's (properties, body)) and the
    original each copy in flight was made of, by the copy's token.

    - `put` when the core has tracked a delivery, `get` to turn a tag back into it;
    - `settled` once a settle frame for it went out (a multiple one settles every tag up
      to its own): the tag is done on its channel; `drop` when the runtime is done with
      a delivery the broker settled on send (AckMode.NONE sends no settle frames);
    - `decided` right after the core decided actions (the executor's lock held): each
      Republish's original is remembered under the copy's token until `answered`, so a
      copy sent once more (`Republish.again_of`) is made of the same original even after
      the delivery itself is done with.

    The tags of the last `KEPT_GENERATIONS` generations are kept (deliveries of a channel
    that closed may still reach the core, which drops them as stale; with AckMode.NONE
    their handlers still run and may dead-letter them).
    """

    __slots__ = ("_copies", "_gens", "_last", "_tags")

    def __init__(self) -> None:
        self._gens: dict[int, dict[int, T]] = {}
        self._last = -1  # the newest generation, whose map is `_tags`
        self._tags: dict[int, T] = {}
        self._copies: dict[int, T] = {}

    def _of(self, gen: int) -> dict[int, T] | None:
        return self._tags if gen == self._last else self._gens.get(gen)

    def put(self, gen: int, tag: int, obj: T) -> None:
        if gen != self._last:
            tags = self._gens.get(gen)
            if tags is None:
                tags = self._gens[gen] = {}
                if gen > self._last:
                    self._last, self._tags = gen, tags
                # deliveries of channels long closed: the core drops them as stale
                for old in [g for g in self._gens if g <= self._last - KEPT_GENERATIONS]:
                    del self._gens[old]
            tags[tag] = obj
            return
        self._tags[tag] = obj

    def get(self, gen: int, tag: int) -> T | None:
        tags = self._of(gen)
        return None if tags is None else tags.get(tag)

    def drop(self, gen: int, tag: int) -> None:
        tags = self._of(gen)
        if tags is not None:
            tags.pop(tag, None)

    def settled(self, gen: int, a: Ack | Nack | Reject) -> None:
        """A settle frame for `a.tag` went out on generation `gen`'s channel."""
        tags = self._tags if gen == self._last else self._gens.get(gen)
        if not tags:
            return
        if type(a) is Reject or not a.multiple:  # type: ignore[union-attr]
            tags.pop(a.tag, None)
            return
        # tags arrive in ascending order: a multiple frame settles a prefix (only the
        # prefix is read, not every delivery in flight)
        upto = a.tag
        done = []
        for tag in tags:
            if tag > upto:
                break
            done.append(tag)
        for tag in done:
            del tags[tag]

    def decided(self, gen: int, acts: Iterable[Action]) -> None:
        """The core decided `acts` for generation `gen`: remember each copy's original."""
        for a in acts:
            if type(a) is Republish:
                obj = self._copies.get(a.again_of) if a.again_of else self.get(gen, a.tag)
                if obj is not None:
                    self._copies[a.token] = obj

    def copy(self, token: int) -> T | None:
        """The original of the copy with `token`."""
        return self._copies.get(token)

    def answered(self, token: int) -> None:
        """The broker answered the copy with `token` (or it was never sent)."""
        self._copies.pop(token, None)

    def __len__(self) -> int:
        return sum(len(t) for t in self._gens.values())
