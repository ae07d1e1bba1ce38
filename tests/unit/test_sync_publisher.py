"""The pika confirm publisher shared by the App and the Spark source, without a broker:
which copy a basic.return is about, and what each owner is told when confirms arrive."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pika.spec import Basic

from ackkit._core.actions import Republish
from ackkit._sync.publisher import Pending, Publisher, returned_publish


class Owner:
    """A listener as the publisher sees it: its core says every copy is current."""

    name = "owner"

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.core = SimpleNamespace(publishable=lambda token: True)
        self.log = SimpleNamespace(error=lambda *a: None)
        self.reports: dict[int, tuple[bool, bool]] = {}
        self.lost: dict[int, str | None] = {}
        self.bodies: dict[int, bytes] = {}  # token -> the original's body

    def original(self, a: Republish) -> tuple[Any, bytes]:
        return None, self.bodies[a.token]

    def copy(self, token: int, body: bytes, **kw: Any) -> Republish:
        """A copy (token = the original's tag) of a delivery with `body`."""
        self.bodies[token] = body
        return Republish(token, token, **kw)

    def republished(
        self, gen: int, token: int, ok: bool, unroutable: bool = False, lost: str | None = None
    ) -> None:
        assert token not in self.reports, "a copy reported twice"
        self.reports[token] = (ok, unroutable)
        self.lost[token] = lost

    def republish_failed(self, token: int, why: str) -> None:
        raise AssertionError(why)


def publisher() -> tuple[Publisher, list[tuple[str, str, bytes]]]:
    conn = SimpleNamespace(is_open=True, ioloop=SimpleNamespace(call_later=lambda *a: None))
    host = SimpleNamespace(connection=conn, stopping=False)
    pub = Publisher(host)  # type: ignore[arg-type]
    sent: list[tuple[str, str, bytes]] = []
    pub.channel = SimpleNamespace(
        is_open=True,
        basic_publish=lambda ex, rk, body, props, mandatory: sent.append((ex, rk, body)),
    )
    return pub, sent


def returned(ex: str, rk: str) -> Any:
    return SimpleNamespace(exchange=ex, routing_key=rk, reply_text="NO_ROUTE")


def confirm(tag: int, multiple: bool = False) -> Any:
    return SimpleNamespace(method=Basic.Ack(delivery_tag=tag, multiple=multiple))


def test_the_oldest_unconfirmed_copy_to_the_same_place_is_returned() -> None:
    pending = {
        1: Pending(lambda *_: None, "", "a", b"x"),
        2: Pending(lambda *_: None, "", "b", b"x"),
        3: Pending(lambda *_: None, "", "b", b"x"),
        4: Pending(lambda *_: None, "dlx", "b", b"x"),
    }
    assert returned_publish(pending, "", "b", b"x") == 2
    pending[2].returned = True
    assert returned_publish(pending, "", "b", b"x") == 3
    assert returned_publish(pending, "dlx", "b", b"x") == 4
    assert returned_publish(pending, "", "c", b"x") is None


def test_a_routed_copy_waiting_for_its_confirm_is_not_taken_for_a_returned_one() -> None:
    """Copy 1 went to a queue (its confirm is slow); the queue was deleted; copy 2 to the
    same routing key came back. Taking the oldest unconfirmed (the Spark source's rule)
    or the oldest to that routing key (the App's) marked copy 1: its original was copied
    again and copy 2's original acked with its copy lost."""
    pub, _ = publisher()
    owner = Owner()
    for token, body in ((1, b"one"), (2, b"two")):
        pub.publish(owner, 1, owner.copy(token, body, exchange="", routing_key="q.dlq"))  # type: ignore[arg-type]
    pub._on_return(None, returned("", "q.dlq"), None, b"two")
    pub._on_confirm(confirm(2))
    pub._on_confirm(confirm(1))
    assert owner.reports == {1: (True, False), 2: (False, True)}


places = st.sampled_from([("", "a"), ("", "b"), ("dlx", "a")])


@settings(max_examples=300, deadline=None)
@given(
    copies=st.lists(st.tuples(places, st.sampled_from([b"x", b"y"]), st.booleans()), max_size=12),
    order=st.randoms(use_true_random=False),
)
def test_every_confirm_reports_whether_that_copy_came_back(copies: Any, order: Any) -> None:
    """A broker's frames for these copies: each unroutable copy's basic.return, in publish
    order and before its own basic.ack; the acks of all copies in any order. Every owner
    is told once per copy, ok exactly when it was routed (up to copies that are the same
    bytes to the same place, which cannot be told apart)."""
    pub, sent = publisher()
    owners = [Owner(), Owner()]
    for i, ((ex, rk), body, _routed) in enumerate(copies, start=1):
        copy = owners[i % 2].copy(i, body, exchange=ex, routing_key=rk)
        pub.publish(owners[i % 2], 1, copy)  # type: ignore[arg-type]
    assert [s for s in sent] == [(ex, rk, body) for (ex, rk), body, _ in copies]
    acks: list[int] = []
    for i, ((ex, rk), body, routed) in enumerate(copies, start=1):
        if not routed:
            pub._on_return(None, returned(ex, rk), None, body)
        acks.append(i)
        order.shuffle(acks)
        while acks and order.random() < 0.5:
            pub._on_confirm(confirm(acks.pop()))
    for tag in acks:
        pub._on_confirm(confirm(tag))
    assert pub.pending == {}
    got: dict[Any, list[bool]] = {}
    want: dict[Any, list[bool]] = {}
    for i, (place, body, routed) in enumerate(copies, start=1):
        ok, unroutable = owners[i % 2].reports[i]
        assert ok is not unroutable
        got.setdefault((place, body), []).append(ok)
        want.setdefault((place, body), []).append(routed)
    assert {k: sorted(v) for k, v in got.items()} == {k: sorted(v) for k, v in want.items()}


def test_a_copy_waiting_for_its_queue_is_reported_when_the_channel_closes() -> None:
    """A declare the broker refuses closes the publisher channel: the copy waiting for
    it is refused (the core's bounded rule decides), never forgotten with its original
    unsettled (the App lost it)."""
    pub, _ = publisher()
    owner = Owner()
    pub.channel.queue_declare = lambda *a, **kw: None
    copy = owner.copy(7, b"b", exchange="", routing_key="q.x", declare=("q.x", {}))
    pub.publish(owner, 1, copy)  # type: ignore[arg-type]
    assert owner.reports == {}
    pub._on_closed(pub.channel, ConnectionError("406"))
    assert owner.reports == {7: (False, False)}
    assert owner.lost == {7: "ConnectionError: 406"}  # the close's reason, for the core
    assert pub.declaring == []


def test_a_copy_whose_original_is_not_remembered_is_reported_not_raised() -> None:
    """The I/O thread never dies over one copy: an original the executor cannot find
    (never expected) is reported to the core as a copy that could not be built."""
    pub, sent = publisher()
    failed: list[tuple[int, str]] = []
    owner = Owner()
    owner.republish_failed = lambda token, why: failed.append((token, why))  # type: ignore[method-assign]
    pub.publish(owner, 1, Republish(9, 9, exchange="", routing_key="q.dlq"))  # type: ignore[arg-type]
    assert sent == []
    assert [t for t, _ in failed] == [9]
