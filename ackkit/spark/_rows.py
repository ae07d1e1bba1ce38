"""What the streaming source makes of a delivery's bytes for its rows.

The dedup key (`key_from`), the payload decoded and validated against the
source's pydantic model, and the metadata columns (`RowMeta`). Pure functions
of the delivery: whether an invalid payload fails the query or is
dead-lettered, and which deliveries a batch holds, stay with the consumer and
the core (`ListenerCore`, `BatchLedger`).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from .._core.listener import Tracked
from .._messages.delivery import _validation_reason
from .._sync import _frames as frames
from ._options import KeyFrom
from ._schema import RowMeta, header_text


@dataclass(slots=True)
class Item:
    """A delivery waiting to be handed out in a batch."""

    tracked: Tracked
    key: str | None
    meta: RowMeta
    parsed: dict[str, Any] | None
    error: str | None = None

    def invalid(self, queue: str) -> str:
        """Why the query fails on this item (its payload did not validate)."""
        return (
            f"message {self.meta.message_id or '(no message_id)'} on {queue!r} "
            f"does not validate: {self.error} (set option on_invalid=dead_letter to "
            "dead-letter such messages instead of failing the query)"
        )


def key_of(key_from: KeyFrom, message_id: str | None, body: bytes) -> str | None:
    """The key a replayed or redelivered copy is recognised by, if the source keeps one."""
    if key_from is KeyFrom.MESSAGE_ID:
        return message_id if message_id else None
    if key_from is KeyFrom.BODY:
        return hashlib.sha256(body).hexdigest()
    return None


def decode(model: type[BaseModel] | None, body: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """The body validated against `model`: (fields, None), or (None, why it is invalid);
    (None, None) without a model."""
    if model is None:
        return None, None
    if not body:
        return None, "empty body"
    try:
        return model.model_validate_json(body).model_dump(), None
    except ValidationError as exc:
        return None, _validation_reason(model, exc)


def row_meta(
    method: Any,
    props: Any,
    body: bytes,
    headers: dict[str, Any] | None,
    attempt: int,
    exchange: str | None = None,
    routing_key: str | None = None,
) -> RowMeta:
    """The metadata columns of one delivery (`headers`: None when they were unreadable;
    `exchange`, `routing_key`: as text already, when the caller has them)."""
    ts = props.timestamp
    return RowMeta(
        props.message_id,
        body,
        {k: header_text(v) for k, v in headers.items()} if headers else None,
        frames.text(method.routing_key) if routing_key is None else routing_key,
        frames.text(method.exchange) if exchange is None else exchange,
        bool(method.redelivered),
        attempt,
        props.content_type,
        int(ts.timestamp()) if isinstance(ts, _dt.datetime) else ts,
    )
