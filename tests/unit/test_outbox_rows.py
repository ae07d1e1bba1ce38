"""An outbox row always carries a message_id (a handler's `publish` writes rows with
`to_row` as `enqueue` does): the one given, else a new one, message_id=None included."""

from __future__ import annotations

import json
import re

from ackkit._messages.publish import outgoing
from ackkit.inbox._outbox import from_row, to_row


def test_a_row_keeps_a_given_id_and_gets_one_for_none() -> None:
    given = to_row(outgoing("q", b"x", message_id="m-1"))
    none = to_row(outgoing("q", b"x", message_id=None))
    assert json.loads(given[3])["message_id"] == "m-1"
    new = json.loads(none[3])["message_id"]
    assert re.fullmatch(r"[0-9a-f]{32}", new)
    assert from_row(*none).properties["message_id"] == new
