"""Crash test: consumer processes SIGKILLed at seeded random moments while 2,000
messages (ACKKIT_INBOX_CRASH_N=10000 for the slow mode) flow through an inbox listener
that records a row and sends a follow-up through the outbox to a second inbox listener,
with some messages published twice. In the end: every message's row exactly once,
every follow-up's row exactly once, the inbox holds one key per message and listener,
the queues are drained, the dead-letter queues and the outbox empty."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pika
import psycopg
import pytest

from ackkit.testing import BrokerHandle

from ._harness import eventually

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

N = int(os.environ.get("ACKKIT_INBOX_CRASH_N", "2000"))
SEED = int(os.environ.get("ACKKIT_INBOX_CRASH_SEED", "21"))
WORKER = str(Path(__file__).with_name("_crash_worker.py"))


def _spawn(args: list[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.Popen(
        [sys.executable, WORKER, *args], stdout=subprocess.PIPE, text=True, env=env
    )
    return p


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


def test_every_effect_exactly_once_under_sigkill(
    rabbitmq: BrokerHandle, queue_factory: Any, postgres_dsn: str, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    qa = queue_factory("a", declare=True)
    qb = queue_factory("b", declare=True)
    with psycopg.connect(postgres_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE effects_a (msg text)")
        c.execute("CREATE TABLE effects_b (msg text)")
    log = tmp_path / "inbox.log"
    args = [rabbitmq.url, postgres_dsn, qa, qb, str(log)]
    workers = [_spawn(args), _spawn(args)]
    ids = [f"m{i}" for i in range(N)]
    twins = rng.sample(ids, N // 20)  # published twice: the inbox absorbs the second
    kills = 0
    t0 = time.monotonic()
    try:
        for w in workers:
            assert w.stdout is not None and w.stdout.readline().strip() == "ready"
        chunk = 50
        order = ids + twins
        rng.shuffle(order)
        conn = rabbitmq.connect()
        ch = conn.channel()
        ch.confirm_delivery()
        for start in range(0, len(order), chunk):
            for mid in order[start : start + chunk]:
                props = pika.BasicProperties(message_id=mid, delivery_mode=2)
                ch.basic_publish("", qa, b"x", props)
            # kill one worker at a random moment (in a handler, between commit and ack,
            # in the relay: wherever it is), and start a fresh one
            time.sleep(rng.uniform(0.02, 0.4))
            i = rng.randrange(len(workers))
            _kill(workers[i])
            kills += 1
            workers[i] = _spawn(args)
        conn.close()
        time.sleep(rng.uniform(0.1, 0.5))
        _kill(workers[0])
        kills += 1
        workers[0] = _spawn(args)

        last: list[Any] = []

        def drained() -> bool:
            a, b = rabbitmq.counts(qa), rabbitmq.counts(qb)
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
            alive = [w.poll() is None for w in workers]
            raise AssertionError(f"{exc}; last: {last}; workers alive: {alive}") from None
    finally:
        for w in workers:
            _kill(w, signal.SIGTERM)
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
        c_ = rabbitmq.counts(q)
        assert c_.ready == c_.unacked == 0
        assert rabbitmq.counts(f"{q}.dlq").total == 0
    absorbed = sum("duplicate of message" in ln for ln in log.read_text().splitlines())
    assert absorbed >= len(twins)  # at least every twin publish (redeliveries add more)
    print(
        f"\ninbox crash test: {N} messages + {len(twins)} twins, {kills} SIGKILLs, "
        f"{absorbed} duplicates absorbed, {took:.1f} s"
    )
