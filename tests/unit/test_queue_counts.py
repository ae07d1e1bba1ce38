"""`broker.counts(q)` reads as the docs' table of helpers shows it, by attribute and by
key (`counts["ready"]` raised TypeError: 'QueueCounts' object is not subscriptable)."""

from __future__ import annotations

import pytest

from ackkit.testing import InMemoryBroker


def test_counts_read_by_attribute_and_by_key() -> None:
    with InMemoryBroker() as broker:
        conn = broker.connect()
        conn.channel().queue_declare("orders")
        conn.close()
        broker.publish_many("orders", [b"a", b"b"])
        counts = broker.counts("orders")
        assert counts.ready == counts["ready"] == 2
        assert counts["unacked"] == 0 and counts["total"] == 2 and counts["consumers"] == 0
        with pytest.raises(KeyError, match="ready, unacked, total, consumers"):
            counts["messages"]
