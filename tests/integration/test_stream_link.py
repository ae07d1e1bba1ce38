"""The stream source's per-process connections (`ackkit.spark._stream_broker.Link`),
against a real stream-enabled node: what they read is checked against a plain rstream
reader, and they must come back after the broker closed them."""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid
from typing import Any

import pytest

from ackkit.spark import _stream_broker as io
from ackkit.spark._core.stream_offsets import Range
from ackkit.streams import stream_connection
from tests._streams import declare_stream, delete_queues, publish, read_all

pytestmark = pytest.mark.integration


@pytest.fixture
def stream(stream_broker: Any) -> Any:
    name = f"link-{uuid.uuid4().hex[:8]}"
    declare_stream(stream_broker.url, name)
    items = [(f"m{i}", f"body-{i}".encode()) for i in range(1200)]
    publish(stream_broker.url, stream_broker.stream_port, name, items)
    yield name
    delete_queues(stream_broker.url, name)


def _link(node: Any) -> io.Link:
    return io.link(stream_connection(node.url, node.stream_port))


def _read(link: io.Link, rng: Range) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    link.read_range(rng, 10, lambda off, _ts, data: got.append((off, data)))
    return got


def test_probes_and_ranges_match_a_plain_reader(stream_broker: Any, stream: str) -> None:
    node = stream_broker
    truth = read_all(node.url, node.stream_port, stream)
    assert len(truth) == 1200
    link = _link(node)
    firsts, tails = link.probe([stream], ["first", "tail"], 5)
    assert firsts[stream] == truth[0][0]
    assert tails[stream] == truth[-1][0] + 1
    # ranges that start and end inside chunks, read one after another on one link
    cuts = [truth[0][0], 7, 501, 502, 1000, tails[stream]]
    for a, b in itertools.pairwise(cuts):
        assert _read(link, Range(stream, a, b)) == [t for t in truth if a <= t[0] < b]


def test_a_range_of_many_small_chunks_is_read_whole(stream_broker: Any) -> None:
    # 30 records a chunk: a range spans several times the chunks a read has credit for
    # at first, so it finishes only if each chunk handled asks for the next, from the
    # very first (chunks can be handled before the subscription's answer is)
    node = stream_broker
    name = f"link-small-{uuid.uuid4().hex[:8]}"
    declare_stream(node.url, name)
    try:
        items = [(f"s{i}", b"x" * 100) for i in range(30 * io.CREDIT * 4)]
        publish(node.url, node.stream_port, name, items, batch=30)
        link = _link(node)
        for _ in range(3):
            got = _read(link, Range(name, 0, len(items)))
            assert [off for off, _ in got] == list(range(len(items)))
    finally:
        delete_queues(node.url, name)


def test_many_subscriptions_on_one_link_free_their_ids(stream_broker: Any, stream: str) -> None:
    # more short subscriptions than a connection has subscription ids
    link = _link(stream_broker)
    for _ in range(io.MAX_SUBSCRIPTIONS + 20):
        (tails,) = link.probe([stream], ["tail"], 5)
        assert tails[stream] > 0


def test_a_link_comes_back_after_the_broker_closed_its_connections(
    stream_broker: Any, stream: str
) -> None:
    node = stream_broker
    link = _link(node)
    assert len(_read(link, Range(stream, 0, 100))) == 100
    before = [link._locator, *(c for c, _ in link._data.values())]
    writers = [c._conn._writer for c in before]
    node.ctl("close_all_connections", "test: connections closed under a link")
    deadline = time.monotonic() + 10
    while any(c.is_connection_alive() for c in before):  # the premise: they are gone
        assert time.monotonic() < deadline, "the broker did not close the stream connections"
        time.sleep(0.05)
    # the next calls open new connections; nothing is read twice or missed
    got = _read(link, Range(stream, 100, 300))
    assert [off for off, _ in got] == list(range(100, 300))
    (firsts,) = link.probe([stream], ["first"], 5)
    assert firsts[stream] == 0
    # the closed connections were let go of whole: no socket is left open, to be found
    # by the collector in some later test (rstream's close() leaves it open)
    assert all(w.is_closing() for w in writers)


def test_a_forked_child_makes_its_own_link(stream_broker: Any, stream: str) -> None:
    node = stream_broker
    parent = _link(node)
    assert len(_read(parent, Range(stream, 0, 10))) == 10
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: reads through a link of its own, then leaves at once
        code = 1
        try:
            child = _link(node)
            ok = child is not parent and len(_read(child, Range(stream, 10, 20))) == 10
            os.write(w, b"ok" if ok else b"no")
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    assert os.read(r, 2) == b"ok" and status == 0
    # and the parent's link still works
    assert len(_read(parent, Range(stream, 20, 30))) == 10


def test_a_read_in_progress_fails_fast_when_its_connection_is_lost(
    stream_broker: Any, stream: str
) -> None:
    node = stream_broker
    link = _link(node)
    box: list[BaseException] = []

    def waits_for_records_not_written() -> None:
        try:
            link.read_range(Range(stream, 1200, 1300), 60, lambda *_: None)
        except BaseException as exc:
            box.append(exc)

    t = threading.Thread(target=waits_for_records_not_written)
    t.start()
    time.sleep(1.5)
    node.ctl("close_all_connections", "test: connection lost under a read")
    t.join(20)  # not the read's 60 s timeout
    assert not t.is_alive()
    assert len(box) == 1 and isinstance(box[0], ConnectionError), box
    assert "1200..1299" in str(box[0])
    assert len(_read(link, Range(stream, 0, 10))) == 10  # and the link reads on


def test_parts_come_in_order_while_the_range_is_read(stream_broker: Any, stream: str) -> None:
    from ackkit.spark._core.stream_offsets import RangeCursor

    node = stream_broker
    truth = read_all(node.url, node.stream_port, stream)
    link = _link(node)
    cursor = RangeCursor(Range(stream, 3, 1100))
    parts = list(link.read_parts(cursor, 10, lambda off, _ts, data: (off, data), 250))
    assert [len(p) for p in parts] == [250, 250, 250, 250, 97]
    assert [r for p in parts for r in p] == [t for t in truth if 3 <= t[0] < 1100]
    assert cursor.done and not cursor.gaps

    # a reader that stops after the first part ends its subscription: its id is free
    # again, and the next read on the link is whole
    def ids() -> set[int]:
        return {i for _c, used in link._data.values() for i in used}

    before = ids()
    # the read is held at offset 150 until the test has looked (the link gives credit as
    # chunks come, not as parts are taken: on a busy machine a fast read ended before)
    looked = threading.Event()

    def offset(off: int, _ts: int, _data: bytes) -> int:
        if off == 150:
            looked.wait(10)
        return off

    first = link.read_parts(RangeCursor(Range(stream, 0, 1200)), 10, offset, 100)
    assert next(first) == list(range(100))
    assert ids() != before
    looked.set()
    first.close()
    deadline = time.monotonic() + 10
    while ids() != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ids() == before
    assert _read(link, Range(stream, 0, 1200)) == truth


def test_a_part_reader_raises_the_read_error_after_its_parts(stream_broker: Any) -> None:
    from ackkit.spark._core.stream_offsets import RangeCursor

    link = _link(stream_broker)
    missing = f"link-missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(Exception, match=missing):
        list(link.read_parts(RangeCursor(Range(missing, 0, 10)), 5, lambda *a: a, 10))
