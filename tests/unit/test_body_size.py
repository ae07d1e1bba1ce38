"""max_body_size holds whatever the handler takes (bytes or str), without a broker."""

from __future__ import annotations

from typing import Any

import pytest

from ackkit import Delivery
from tests.unit._fakes import core


@pytest.mark.parametrize("kind", [bytes, str])
def test_max_body_size_holds_for_bytes_and_str_handlers(kind: type) -> None:
    """A bytes handler used to get any body, whatever max_body_size said."""
    from ackkit._app.handler import Binding, Decoder
    from ackkit.errors import BadPayload

    def as_bytes(body: bytes) -> None:
        pass

    def as_text(body: str) -> None:
        pass

    b = Binding(as_bytes if kind is bytes else as_text, Decoder(max_body_size=10))
    c = core()

    class _Settler:
        def settle(self, *a: Any) -> None:
            pass

    ok = Delivery(b"x" * 10, None, c.receive(1), _Settler())
    assert b.args(ok) == ((b"x" * 10) if kind is bytes else "x" * 10,)
    big = Delivery(b"x" * 11, None, c.receive(2), _Settler())
    with pytest.raises(BadPayload, match="exceeds max_body_size=10"):
        b.args(big)
