"""`channel_for`: which publishing channel an app message goes on (one per exchange for
the first few, so a publish the broker refuses by closing its channel fails only its
own exchange's messages)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ackkit._publish import EXCHANGE_CHANNELS, channel_for


@given(st.lists(st.text(max_size=6), max_size=40))
def test_an_exchange_keeps_its_channel_and_the_channels_are_bounded(exchanges: list[str]) -> None:
    channels: dict[str, str] = {"": ""}  # key -> key, as the runtimes hold them
    first: dict[str, str] = {}
    for x in exchanges:
        key = channel_for(x, channels)
        channels.setdefault(key, key)
        assert first.setdefault(x, key) == key  # the same exchange, the same channel
        assert key in (x, "")
    assert len(channels) <= EXCHANGE_CHANNELS + 1
    distinct = list(dict.fromkeys(x for x in exchanges if x))
    for x in distinct[:EXCHANGE_CHANNELS]:
        assert first[x] == x  # the first ones each have their own
    assert channel_for("", channels) == ""
