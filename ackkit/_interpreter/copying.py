"""The basic properties of a copy ackkit publishes (retry, dead-letter, restamp), for
any client.

`ackkit._core.copies.copy_properties` decides them from a plain mapping; a runtime
reads its client's properties into such a mapping, measures what its client would send
(so the copy fits in a frame), and builds the properties object its client publishes.
`CopyProperties` joins those three client pieces to the core's rule once, and
`copy_options` turns a `Republish` and the connection's limits into its keywords.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from .._core import copies
from .._core.actions import Republish

P = TypeVar("P")


class CopyProperties(Generic[P]):
    """The properties of a copy of a delivery, ready for one client: `read` gives a
    client's properties as an AMQP-name mapping ({} for None), `encode` the bytes the
    client sends for such a mapping, `build` the client's properties object for it (given
    the bytes `encode` wrote for it, when the core kept them: None otherwise)."""

    __slots__ = ("_build", "_encode", "_read")

    def __init__(
        self,
        read: Callable[[Any], Mapping[str, Any]],
        encode: Callable[[Mapping[str, Any]], bytes],
        build: Callable[[Mapping[str, Any], bytes | None], P],
    ) -> None:
        self._read = read
        self._encode = encode
        self._build = build

    def __call__(
        self,
        props: Any,
        set_headers: Mapping[str, Any],
        *,
        purpose: str = "retry",
        minimal: bool = False,
        frame_max: int = 0,
        user: str | None = None,
    ) -> P:
        """The properties of a copy of a delivery with the client's `props` (None: the
        copy carries `set_headers` only): what `ackkit._core.copies` decides."""
        c = copies.copy_properties(
            self._read(props),
            set_headers,
            purpose=purpose,
            minimal=minimal,
            frame_max=frame_max,
            user=user,
            encode=self._encode,
        )
        return self._build(c.properties, c.encoded)


def copy_options(a: Republish, frame_max: int, user: str | None) -> dict[str, Any]:
    """`CopyProperties` keywords for Republish `a`, published on a connection that
    negotiated `frame_max` (0: none known) and is authenticated as `user`."""
    return {"purpose": a.purpose, "minimal": a.minimal, "frame_max": frame_max, "user": user}
