"""No request of the console blocks another: while the page of a huge dead letter (a
5 MB body, a header as large as a frame allows) is being made, the overview answers,
again and again, on a real broker. Each page is made on a worker thread, not on the
event loop that reads every request."""

from __future__ import annotations

import concurrent.futures
import http.client
import threading
import urllib.parse
import urllib.request
from typing import Any

import pytest
from _console_support import served
from _retry_support import publish, wait_until

from ackkit.console import Holder, Store
from ackkit.console import _render as R

pytestmark = pytest.mark.integration


def _get(url: str, timeout: float = 120) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return str(r.read().decode("utf-8"))


def _slow(url: str, sent: threading.Event, answered: threading.Event) -> str:
    """GET `url`: `sent` is set once the request is on its way, `answered` once its
    response has begun to arrive."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.netloc, timeout=120)
    try:
        conn.request("GET", parts.path)
        sent.set()
        resp = conn.getresponse()
        answered.set()
        return resp.read().decode("utf-8")
    finally:
        answered.set()
        conn.close()


def test_the_overview_answers_while_a_huge_letter_page_is_made(
    rabbitmq: Any, fresh_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dlq = f"{fresh_queue}.dlq"
    # a binary body (shown as a hex dump of its first 64 KB) and a 120 KB header table
    huge = bytes(range(256)) * 20_000  # 5.1 MB
    table = {f"k{i:05d}": f"amqp://u:pw{i}@h/ <b>{i}</b>" for i in range(3_000)}
    publish(rabbitmq.url, dlq, huge, declare=True, message_id="huge", headers={"table": table})
    for i in range(200):
        publish(rabbitmq.url, dlq, b"{}", message_id=f"plain-{i}")
    # The huge letter's page is held in the making until the test has had its overviews:
    # how long a page takes on this machine decides nothing. Made on the event loop that
    # reads every request (the bug), the held page would keep any overview from being
    # read at all, and _get below would time out.
    making, release = threading.Event(), threading.Event()
    made = R.body_view

    def held_body_view(body: bytes) -> Any:
        if len(body) == len(huge):
            making.set()
            release.wait(120)
        return made(body)

    monkeypatch.setattr(R, "body_view", held_body_view)
    holder = Holder(rabbitmq.url, [dlq], Store([dlq]))
    holder.start()
    try:
        assert wait_until(lambda: holder.store.held(dlq) == 201, timeout=30)
        lid = next(
            i
            for i in holder.store.dlq_ids(dlq)
            if (e := holder.store.entry(i)) is not None and e.dl.message_id == "huge"
        )
        with served(holder) as base, concurrent.futures.ThreadPoolExecutor(1) as pool:
            assert dlq in _get(f"{base}/")  # templates loaded, connections warm
            sent, answered = threading.Event(), threading.Event()
            slow = pool.submit(_slow, f"{base}/letter/{lid}", sent, answered)
            try:
                assert making.wait(60), "the letter's page was never made"
                for _ in range(3):  # asked and answered while the big page is being made
                    assert dlq in _get(f"{base}/", timeout=20)
                assert not answered.is_set()
            finally:
                release.set()
            assert "pw7@" not in slow.result(timeout=120)  # masked
    finally:
        holder.stop()
