"""A hostile dead letter on a real broker, shown by the console: a header as long as an
AMQP frame allows (the broker's frame_max, 128 KB, bounds a content header) full of
what made masking slow, with a password URL and markup inside, and a 5 MB body. The
page masks the password, escapes the markup, and comes back quickly; the overview is
served meanwhile. The megabyte cases of the masking itself: tests/unit/test_mask_url.py."""

from __future__ import annotations

import concurrent.futures
import urllib.request
from typing import Any

import pytest
from _console_support import served
from _retry_support import publish, wait_until

from ackkit.console import Holder, Store

pytestmark = pytest.mark.integration


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=120) as r:
        return str(r.read().decode("utf-8"))


def test_a_hostile_letter_is_shown_masked_and_escaped_without_blocking(
    rabbitmq: Any, fresh_queue: str
) -> None:
    dlq = f"{fresh_queue}.dlq"
    # shown cut to its first 4,000 characters, masked as a whole first
    note = "amqp://app:hunter2@db/prod <script>x()</script> " + "a" * 60_000 + "a." * 30_000
    publish(
        rabbitmq.url,
        dlq,
        b"b" * 5_000_000,
        declare=True,
        message_id="hostile",
        headers={"note": note},
    )
    for i in range(3):
        publish(rabbitmq.url, dlq, b"{}", message_id=f"plain-{i}")
    holder = Holder(rabbitmq.url, [dlq], Store([dlq]))
    holder.start()
    try:
        assert wait_until(lambda: holder.store.held(dlq) == 4, timeout=30)
        lid = next(
            i
            for i in holder.store.dlq_ids(dlq)
            if (e := holder.store.entry(i)) is not None and e.dl.message_id == "hostile"
        )
        with served(holder) as base, concurrent.futures.ThreadPoolExecutor(2) as pool:
            letter = pool.submit(_get, f"{base}/letter/{lid}")
            overview = pool.submit(_get, f"{base}/")
            # a ceiling twenty times what the page takes on a busy machine; the quadratic
            # masking took 35 s here (and held every other request up meanwhile)
            page = letter.result(timeout=20)
            assert dlq in overview.result(timeout=20)
        assert "hunter2" not in page
        assert "app:***@db" in page
        assert "<script>x()" not in page and "&lt;script&gt;" in page
        # the broker still holds all four, unacked by the console
        rabbitmq.wait_for(dlq, ready=0, unacked=4)
    finally:
        holder.stop()
    rabbitmq.wait_for(dlq, ready=4, unacked=0)
