"""The console's hold on a real broker: nothing lost while it runs, stops or replays;
two replays of one group never replay a message twice."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from _console_support import KINDS, failing_service, publish_kinds
from _retry_support import drain, publish, wait_until

from ackkit import App, AsyncApp
from ackkit._core import headers as H
from ackkit.console import Holder, Store

pytestmark = pytest.mark.integration
TOTAL = sum(KINDS.values())


@pytest.fixture(params=["App", "AsyncApp"])
def dead_letters(request: pytest.FixtureRequest, rabbitmq: Any, fresh_queue: str) -> str:
    """A DLQ with the failing service's dead letters (made by the sync or async runtime)."""
    q = fresh_queue
    if request.param == "AsyncApp":
        pytest.importorskip("aio_pika")
    app = App(rabbitmq.url) if request.param == "App" else AsyncApp(rabbitmq.url)
    failing_service(app, q, set(), [])
    from _apps import Runner

    runner = Runner(app)
    runner.start()
    try:
        publish_kinds(rabbitmq.url, q)
        rabbitmq.wait_for(f"{q}.dlq", ready=TOTAL, timeout=30)
    finally:
        runner.stop()
    return q


def start(rabbitmq: Any, dlq: str, **kw: Any) -> Holder:
    holder = Holder(rabbitmq.url, [dlq], Store([dlq]), **kw)
    holder.start()
    assert wait_until(lambda: holder.store.held(dlq) == kw.get("max_held", TOTAL), timeout=15)
    return holder


def test_held_while_running_and_all_back_when_it_stops(rabbitmq: Any, dead_letters: str) -> None:
    dlq = f"{dead_letters}.dlq"
    holder = start(rabbitmq, dlq)
    try:
        groups = {g.key.error_type: g.count for g in holder.store.groups()}
        assert groups == {"KeyError": 7, "ValueError": 5, "TimeoutError": 3}
        # the broker still counts every one of them: unacknowledged, held by the console
        # (on two channels: 100,000 held by default, at most 50,000 prefetched per channel)
        rabbitmq.wait_for(dlq, ready=0, unacked=TOTAL, consumers=2)
        publish(rabbitmq.url, dlq, b"late", message_id="late")  # a new failure arrives
        assert wait_until(lambda: holder.store.held(dlq) == TOTAL + 1)
    finally:
        holder.stop()
    rabbitmq.wait_for(dlq, ready=TOTAL + 1, unacked=0, consumers=0)


def test_max_held_bounds_the_hold(rabbitmq: Any, dead_letters: str) -> None:
    dlq = f"{dead_letters}.dlq"
    holder = start(rabbitmq, dlq, max_held=4)
    try:
        rabbitmq.wait_for(dlq, ready=TOTAL - 4, unacked=4)
        assert wait_until(lambda: holder.ready_counts[dlq] == TOTAL - 4, timeout=5)
    finally:
        holder.stop()
    rabbitmq.wait_for(dlq, ready=TOTAL, unacked=0)


def test_two_replays_of_one_group_never_replay_a_message_twice(
    rabbitmq: Any, dead_letters: str
) -> None:
    dlq, parking = f"{dead_letters}.dlq", f"{dead_letters}.parking"
    publish(rabbitmq.url, parking, b"", declare=True)
    drain(rabbitmq.url, parking)
    holder = start(rabbitmq, dlq)
    try:
        (gid,) = [g.id for g in holder.store.groups() if g.key.error_type == "KeyError"]
        ids = holder.store.group_ids(gid)
        results: list[Any] = []
        go = threading.Barrier(2)

        def replay(who: str) -> None:
            go.wait()
            results.append(holder.replay(ids, parking, who).result(30))

        threads = [threading.Thread(target=replay, args=(w,)) for w in ("ann", "bob")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sum(r.done for r in results) == 7
        assert sum(r.done + r.taken for r in results) == 14  # each asked for all 7
        rabbitmq.wait_for(parking, ready=7)
        rabbitmq.wait_for(dlq, ready=0, unacked=TOTAL - 7)
        copies = drain(rabbitmq.url, parking)
        assert sorted(p.message_id for p, _ in copies) == sorted(f"sku-{i}" for i in range(7))
        assert all(p.headers[H.REPLAYED] == 1 for p, _ in copies)
        assert holder.store.groups()[0].key.error_type == "ValueError"
        # delete = ack: gone from the broker
        (tid,) = [g.id for g in holder.store.groups() if g.key.error_type == "TimeoutError"]
        res = holder.delete(holder.store.group_ids(tid), "ann").result(30)
        assert res.done == 3
        rabbitmq.wait_for(dlq, ready=0, unacked=TOTAL - 10)
    finally:
        holder.stop()
    rabbitmq.wait_for(dlq, ready=TOTAL - 10, unacked=0)


def test_replay_to_a_missing_queue_leaves_the_dead_letters(
    rabbitmq: Any, dead_letters: str
) -> None:
    dlq = f"{dead_letters}.dlq"
    holder = start(rabbitmq, dlq)
    try:
        (gid,) = [g.id for g in holder.store.groups() if g.key.error_type == "TimeoutError"]
        res = holder.replay(holder.store.group_ids(gid), f"{dead_letters}.nowhere", "ann").result(
            30
        )
        assert (res.done, res.failed) == (0, 3) and "Unroutable" in res.errors[0]
        assert holder.store.held(dlq) == TOTAL  # released: still held, can be replayed again
        assert len(holder.store.claim(holder.store.group_ids(gid))) == 3
        rabbitmq.wait_for(dlq, unacked=TOTAL)
    finally:
        holder.stop()
    rabbitmq.wait_for(dlq, ready=TOTAL, unacked=0)


def test_a_missing_dlq_is_a_clear_error(rabbitmq: Any, fresh_queue: str) -> None:
    holder = Holder(rabbitmq.url, [f"{fresh_queue}.dlq"], Store([f"{fresh_queue}.dlq"]))
    with pytest.raises(LookupError, match="no queue"):
        holder.start()


def test_a_closed_holding_channel_is_held_again(rabbitmq: Any, dead_letters: str) -> None:
    """A channel the broker closes (as a consumer timeout does on 3.x): what it held went
    back to the queue; the console forgets it, consumes again and can still replay."""
    dlq = f"{dead_letters}.dlq"
    holder = start(rabbitmq, dlq, max_held=TOTAL)  # one channel
    try:
        before = {e.id for g in holder.store.groups() for e in holder.store.group(g.id)[1]}
        # an ack of a tag the channel never delivered: the broker closes the channel
        holder.submit(lambda: holder._slots[dlq][0].ch.basic_ack(10**6)).result(10)
        assert wait_until(lambda: any("closed" in e for e in holder.store.errors), timeout=10)
        assert wait_until(lambda: holder.store.held(dlq) == TOTAL, timeout=15)
        after = {e.id for g in holder.store.groups() for e in holder.store.group(g.id)[1]}
        assert not before & after  # all new entries: the old channel's tags are never used
        rabbitmq.wait_for(dlq, ready=0, unacked=TOTAL)
        (gid,) = [g.id for g in holder.store.groups() if g.key.error_type == "TimeoutError"]
        res = holder.delete(holder.store.group_ids(gid), "ann").result(30)
        assert res.done == 3
        rabbitmq.wait_for(dlq, ready=0, unacked=TOTAL - 3)
    finally:
        holder.stop()
    rabbitmq.wait_for(dlq, ready=TOTAL - 3, unacked=0)


def test_a_lost_connection_loses_nothing_and_the_console_holds_again(
    rabbitmq: Any, dead_letters: str
) -> None:
    if not rabbitmq.own:
        pytest.skip("closes every connection of the node: needs the kit's own node")
    dlq = f"{dead_letters}.dlq"
    holder = start(rabbitmq, dlq)
    try:
        rabbitmq.close_connections("the console's crash, as far as the broker can tell")
        assert wait_until(lambda: any("connection lost" in e for e in holder.store.errors), 10)
        assert wait_until(lambda: holder.store.held(dlq) == TOTAL, timeout=20)
        rabbitmq.wait_for(dlq, ready=0, unacked=TOTAL)
    finally:
        holder.stop()
    rabbitmq.wait_for(dlq, ready=TOTAL, unacked=0)


def test_the_console_command_serves_and_lets_go_on_sigint(rabbitmq: Any, dead_letters: str) -> None:
    """`ackkit console` itself: serves the overview with the password masked, and on
    SIGINT exits and the broker has every dead letter back."""
    import os
    import signal
    import subprocess
    import sys
    import urllib.request

    from _console_support import free_port
    from _retry_support import REPO

    dlq, port = f"{dead_letters}.dlq", free_port()
    cmd = [sys.executable, "-m", "ackkit.cli", "console", "--url", rabbitmq.url]
    cmd += ["--dlq", dlq, "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:

        def overview() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
                    return str(r.read().decode())
            except OSError:
                return None

        page = wait_until(lambda: (p := overview()) and f'class="count">{TOTAL}<' in p and p, 30)
        assert page, "the console did not show the dead letters"
        assert "guest:***@" in page
        rabbitmq.wait_for(dlq, ready=0, unacked=TOTAL)
    finally:
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    rabbitmq.wait_for(dlq, ready=TOTAL, unacked=0, consumers=0)
