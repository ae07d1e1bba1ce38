"""Crash test: consumer processes SIGKILLed at seeded random moments while 2,000
messages (ACKKIT_INBOX_CRASH_N=10000 for the slow mode) flow through an inbox listener
that records a row and sends a follow-up through the outbox to a second inbox listener,
with some messages published twice; in the same run the broker is restarted once and
PostgreSQL once, at seeded points while the messages are published. In the end: every
message's row exactly once, every follow-up's row exactly once, the inbox holds one key
per message and listener, the queues are drained, the dead-letter queues and the outbox
empty. One worker is never killed: it lives through both restarts and drains the last
chunk, published after the others were killed, alone. The workers run an App
(ACKKIT_INBOX_CRASH_KIND=async: an AsyncApp).

The broker restart needs a node of the kit's own (under AMQP_URL the run has the
SIGKILLs only), the PostgreSQL restart the kit's own cluster (under
ACKKIT_TEST_POSTGRES_DSN: no database restart)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pika
import psycopg
import pytest

from ackkit.testing import BrokerHandle
from ackkit_testkit import wait_postgres

from ._harness import eventually

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.one_leg]

N = int(os.environ.get("ACKKIT_INBOX_CRASH_N", "2000"))
SEED = int(os.environ.get("ACKKIT_INBOX_CRASH_SEED", "21"))
KIND = os.environ.get("ACKKIT_INBOX_CRASH_KIND", "sync")
WORKER = str(Path(__file__).with_name("_crash_worker.py"))
# a SIGKILL per chunk published (each costs a worker's start): make test's 2,000
# messages take ~21, make soak's 10,000 (ACKKIT_INBOX_CRASH_N) ~200
CHUNK = 100 if N <= 2000 else 50


def _spawn(args: list[str]) -> subprocess.Popen[str]:
    """A worker; its stderr (the library's log: reconnects while the broker restarts)
    goes to workers.err next to the inbox log."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with open(Path(args[4]).with_name("workers.err"), "a") as err:
        return subprocess.Popen(
            [sys.executable, WORKER, *args], stdout=subprocess.PIPE, stderr=err, text=True, env=env
        )


def _kill(w: subprocess.Popen[str], sig: int = signal.SIGKILL) -> None:
    if w.poll() is None:
        w.send_signal(sig)
    try:
        w.wait(30)
    except subprocess.TimeoutExpired:
        w.kill()
        w.wait(10)
    if w.stdout is not None:
        w.stdout.close()


def _one(dsn: str, sql: str) -> Any:
    with psycopg.connect(dsn) as c:
        row = c.execute(sql).fetchone()
        return row[0] if row else None


class Publisher:
    """Publishes with confirms; through a broker restart it connects again and publishes
    again what was not confirmed (it may have arrived: the inbox absorbs it), calling
    `meanwhile()` between its tries."""

    def __init__(self, broker: BrokerHandle, queue: str, meanwhile: Any) -> None:
        self.broker, self.queue, self.meanwhile = broker, queue, meanwhile
        self.conn: Any = None
        self.ch: Any = None
        self.again = 0
        """Publishes tried again after the connection failed under them."""
        self.reconnects = 0

    def send(self, message_id: str, deadline: float = 180.0) -> None:
        until = time.monotonic() + deadline
        tried = False
        while True:
            try:
                if self.ch is None:
                    self.conn = self.broker.connect()
                    self.ch = self.conn.channel()
                    self.ch.confirm_delivery()
                    self.reconnects += tried
                if tried:
                    self.again += 1
                props = pika.BasicProperties(message_id=message_id, delivery_mode=2)
                self.ch.basic_publish("", self.queue, b"x", props)
                return
            except (pika.exceptions.AMQPError, OSError):
                tried = True
                self.close()
                if time.monotonic() > until:
                    raise
                self.meanwhile()

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
        self.conn = self.ch = None


class Restart(threading.Thread):
    """Runs `fn` once in the background; `took` is how long it took (the downtime)."""

    def __init__(self, fn: Any) -> None:
        super().__init__(daemon=True)
        self.fn, self.took, self.error = fn, 0.0, None  # type: ignore[var-annotated]

    def run(self) -> None:
        t = time.monotonic()
        try:
            self.fn()
        except BaseException as exc:  # reported by the test
            self.error = exc  # type: ignore[assignment]
        self.took = time.monotonic() - t


@pytest.fixture
def crash_broker(request: pytest.FixtureRequest) -> tuple[BrokerHandle, bool]:
    """A node of the kit's own the test may restart (True), else the session's broker."""
    try:
        return request.getfixturevalue("own_rabbitmq"), True
    except pytest.skip.Exception:
        return request.getfixturevalue("rabbitmq"), False


def test_every_effect_exactly_once_under_sigkill_and_restarts(
    crash_broker: tuple[BrokerHandle, bool],
    queue_factory: Any,
    postgres: Any,
    postgres_dsn: str,
    tmp_path: Path,
) -> None:
    broker, may_restart = crash_broker
    rng = random.Random(SEED)
    qa = queue_factory("a", declare=True, broker=broker)
    qb = queue_factory("b", declare=True, broker=broker)
    with psycopg.connect(postgres_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE effects_a (msg text)")
        c.execute("CREATE TABLE effects_b (msg text)")
    log = tmp_path / "inbox.log"
    args = [broker.url, postgres_dsn, qa, qb, str(log), KIND]
    # two workers SIGKILLed in turn (each killed one replaced at once), and a steady one
    # never killed: it lives through both restarts, and drains the last chunk alone
    workers = [_spawn(args), _spawn(args)]
    steady = _spawn(args)
    ids = [f"m{i}" for i in range(N)]
    twins = rng.sample(ids, N // 20)  # published twice: the inbox absorbs the second
    order = ids + twins
    rng.shuffle(order)
    chunks = range(0, len(order), CHUNK)
    # the restarts, at seeded chunks: the broker in the first half, PostgreSQL in the second
    at_broker = rng.randrange(len(chunks) // 5, len(chunks) * 2 // 5)
    at_pg = rng.randrange(len(chunks) * 3 // 5, len(chunks) * 4 // 5)
    pg_pause = rng.uniform(0.5, 2.0)

    def restart_pg() -> None:
        postgres.stop()
        try:
            time.sleep(pg_pause)
        finally:
            postgres.start()
            wait_postgres(postgres.dsn)

    restarts: dict[str, Restart] = {}
    kills = kills_down = 0
    down_rng = random.Random(SEED + 1)  # while the broker is down: as many as it takes

    def kill_one(r: random.Random) -> None:
        # kill one worker at a random moment (in a handler, between commit and ack, in
        # the relay, reconnecting: wherever it is), and start a fresh one
        nonlocal kills
        time.sleep(r.uniform(0.02, 0.4))
        i = r.randrange(len(workers))
        _kill(workers[i])
        kills += 1
        workers[i] = _spawn(args)

    def while_down() -> None:
        # a kill per second or so while the broker restarts (each costs a worker's start:
        # one per publish try made for dozens on a busy machine)
        nonlocal kills_down
        time.sleep(down_rng.uniform(0.4, 1.0))
        kill_one(down_rng)
        kills_down += 1

    pub = Publisher(broker, qa, while_down)
    t0 = time.monotonic()
    try:
        for w in [*workers, steady]:
            assert w.stdout is not None and w.stdout.readline().strip() == "ready"
        for n, start in enumerate(chunks):
            if start + CHUNK >= len(order):
                break  # the last chunk: for the steady worker alone
            if n == at_broker and may_restart:
                restarts["broker"] = Restart(broker.restart)
                restarts["broker"].start()
            if n == at_pg and postgres.own:
                restarts["postgres"] = Restart(restart_pg)
                restarts["postgres"].start()
            for mid in order[start : start + CHUNK]:
                pub.send(mid)
            kill_one(rng)
        for r in restarts.values():
            r.join(300)
            assert r.error is None, r.error
        for w in workers:
            _kill(w)
            kills += 1
        pub.meanwhile = lambda: time.sleep(0.2)
        for mid in order[start:]:
            pub.send(mid)
        pub.close()
        last: list[Any] = []

        def drained() -> bool:
            a, b = broker.counts(qa), broker.counts(qb)
            outbox = _one(postgres_dsn, "SELECT count(*) FROM ackkit_outbox")
            effects_b = _one(postgres_dsn, "SELECT count(*) FROM effects_b")
            last[:] = [a, b, f"outbox={outbox}", f"effects_b={effects_b}"]
            return (
                a.ready == a.unacked == b.ready == b.unacked == 0
                and outbox == 0
                and (effects_b >= N)
            )

        try:
            eventually(drained, timeout=60 + N / 10, what="queues drained, outbox empty")
        except AssertionError as exc:
            alive = steady.poll() is None
            if alive:  # its stacks to workers.err, for the post-mortem
                steady.send_signal(signal.SIGUSR1)
                time.sleep(1.0)
            raise AssertionError(f"{exc}; last: {last}; steady worker alive: {alive}") from None
        assert steady.poll() is None, "the steady worker died"
    finally:
        for w in [*workers, steady]:
            _kill(w, signal.SIGTERM)
        for r in restarts.values():
            r.join(300)  # PostgreSQL is started again whatever happened (the session's)
    took = time.monotonic() - t0
    with psycopg.connect(postgres_dsn) as c:
        a_rows = c.execute("SELECT msg, count(*) FROM effects_a GROUP BY msg").fetchall()
        b_rows = c.execute("SELECT msg, count(*) FROM effects_b GROUP BY msg").fetchall()
        keys = c.execute("SELECT listener, count(*) FROM ackkit_inbox GROUP BY 1").fetchall()
        outbox = c.execute("SELECT count(*) FROM ackkit_outbox").fetchone()
    assert sorted(m for m, _ in a_rows) == sorted(ids)
    assert all(n == 1 for _, n in a_rows), [r for r in a_rows if r[1] != 1][:5]
    assert sorted(m for m, _ in b_rows) == sorted(f"{m}-f" for m in ids)
    assert all(n == 1 for _, n in b_rows), [r for r in b_rows if r[1] != 1][:5]
    assert dict(keys) == {"a": N, "b": N}
    assert outbox == (0,)
    for q in (qa, qb):
        c_ = broker.counts(q)
        assert c_.ready == c_.unacked == 0
        assert broker.counts(f"{q}.dlq").total == 0
    absorbed = sum("duplicate of message" in ln for ln in log.read_text().splitlines())
    assert absorbed >= len(twins)  # at least every twin publish (redeliveries add more)
    down = ", ".join(f"{k} restart {r.took:.1f} s" for k, r in restarts.items()) or "no restarts"
    print(
        f"\ninbox crash test ({KIND}, RabbitMQ {broker.server_version()}): {N} messages + "
        f"{len(twins)} twins, {pub.again} published again after the broker restart, "
        f"{kills} SIGKILLs ({kills_down} while the publisher could not reach the broker), "
        f"{down}, {absorbed} duplicates absorbed, {took:.1f} s"
    )
