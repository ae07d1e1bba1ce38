"""The overview while the console is still indexing a large DLQ: it says so (indexed N
of M, M the broker's count), and the numbers it shows add up to what the broker has."""

from __future__ import annotations

import re
import time
from typing import Any

import pika
import pytest
from _console_support import served
from _retry_support import wait_until

from ackkit._core import headers as H
from ackkit.console import Holder, Store

pytestmark = pytest.mark.integration
N = 1500


class SlowIndexer(Holder):
    """Indexes about 500 dead letters a second, so the page can be read half way."""

    def _on_message(self, *args: Any) -> None:
        time.sleep(0.002)
        super()._on_message(*args)


def numbers(page: str) -> dict[str, int]:
    out = {}
    for name in ("indexed", "of", "held", "on-the-way", "ready", "in-queue"):
        m = re.search(rf'class="(?:num )?{name}">(\d+)<', page)
        if m:
            out[name] = int(m.group(1))
    return out


def test_indexing_shows_progress_and_counts_that_add_up(rabbitmq: Any, fresh_queue: str) -> None:
    import urllib.request

    dlq = f"{fresh_queue}.dlq"
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq.url))
    ch = conn.channel()
    ch.queue_declare(dlq, durable=True)
    for i in range(N):
        h = {H.REASON: "x", H.ERROR_TYPE: "KeyError", H.ERROR_MESSAGE: f"'k{i}'"}
        ch.basic_publish("", dlq, b"{}", pika.BasicProperties(message_id=f"m{i}", headers=h))
    conn.close()
    rabbitmq.wait_for(dlq, ready=N, timeout=30)
    holder = SlowIndexer(rabbitmq.url, [dlq], Store([dlq]))
    holder.start()
    try:
        with served(holder) as base:

            def overview() -> str:
                with urllib.request.urlopen(f"{base}/", timeout=10) as r:
                    return str(r.read().decode())

            seen: list[dict[str, int]] = []
            while holder.store.held(dlq) < N:
                page = overview()
                n = numbers(page)
                if "Indexing" in page and 0 < n["held"] < N:
                    seen.append(n)
                time.sleep(0.2)
            assert seen, "the overview never said it was indexing"
            for n in seen:
                assert n["of"] == N  # the broker's count when the console connected
                assert n["indexed"] == n["held"] and n["on-the-way"] > 0
                # ready: the broker's count, "-" until the flood of deliveries let it ask
                assert n["held"] + n["on-the-way"] + n.get("ready", 0) == n["in-queue"] == N
            # the broker counts them all, unacknowledged: the console has them (or they
            # are on their way to it)
            assert rabbitmq.counts(dlq).total == N
            assert wait_until(lambda: "Indexing" not in overview(), timeout=15)
            done = numbers(overview())
            assert done["held"] == done["in-queue"] == N and "on-the-way" not in done
            assert done["ready"] == 0
            rabbitmq.wait_for(dlq, ready=0, unacked=N)
    finally:
        holder.stop()
    rabbitmq.wait_for(dlq, ready=N, unacked=0, timeout=30)
