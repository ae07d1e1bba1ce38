"""`channel_for`: which publishing channel an app message goes on (one per exchange for
the first few, so a publish the broker refuses by closing its channel fails only its
own exchange's messages), within the channels the connection has room for."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ackkit._core.consume import channels_needed, spare_channels
from ackkit._messages.publish import EXCHANGE_CHANNELS, channel_for


@given(st.lists(st.text(max_size=6), max_size=40), st.integers(0, EXCHANGE_CHANNELS))
def test_an_exchange_keeps_its_channel_and_the_channels_are_bounded(
    exchanges: list[str], limit: int
) -> None:
    channels: dict[str, str] = {"": ""}  # key -> key, as the runtimes hold them
    first: dict[str, str] = {}
    for x in exchanges:
        key = channel_for(x, channels, limit)
        channels.setdefault(key, key)
        assert first.setdefault(x, key) == key  # the same exchange, the same channel
        assert key in (x, "")
    assert len(channels) <= limit + 1
    distinct = list(dict.fromkeys(x for x in exchanges if x))
    for x in distinct[:limit]:
        assert first[x] == x  # the first ones each have their own
    assert channel_for("", channels, limit) == ""


@given(st.integers(1, 50), st.integers(0, 200))
def test_the_spare_channels_never_take_the_apps_own(listeners: int, channel_max: int) -> None:
    spare = spare_channels(listeners, channel_max)
    limit = channel_max or 65535
    assert spare >= 0
    assert channels_needed(listeners) + spare <= max(limit, channels_needed(listeners))
    if limit >= channels_needed(listeners):
        assert channels_needed(listeners) + spare == limit
