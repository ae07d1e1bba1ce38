"""The chaos run: a producer, consumer processes and faults on a broker node of the suite's own.

1. A node of the test kit's own (never the shared AMQP_URL broker): its channels
   time out unacknowledged deliveries after `consumer_timeout_ms`.
2. Two durable queues, one classic and one quorum. The producer keeps a backlog
   of persistent messages in them (publisher confirms, a fresh connection per
   chunk) until all are published: ~10% poison, a few percent bad payloads, a
   couple of slow ones, the rest good (see messages.py).
3. Consumer processes (sync App and AsyncApp alternating, AUTO mode with batched
   multiple-acks, Retry(max_attempts=3, BROKER), DLQ `<queue>.dlq`) connect
   through a TCP proxy of ours and record every handler run (consumer.py).
4. Faults, spread over the run by progress: SIGKILL of a random consumer (a new
   one starts), broker node restarts, connection cuts (every other one by the
   proxy resetting the TCP connections, the others by the broker's
   close_all_connections), and the slow messages' handlers blocking past the
   consumer timeout (the broker closes that channel).
5. Drain: wait until the origin and delay queues are empty, stop the consumers
   gracefully, read both DLQs from the broker, scan the consumer logs and the
   broker log, and compute the figures (analysis.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pika

from ackkit.testing import BrokerHandle, BrokerUnavailable, provision_broker

from .analysis import Fault, Story, analyse, parse_records
from .consumer import RETRY
from .messages import EXPECTED_REASON, OVER_AMQP10, Message, plan

REPO = Path(__file__).resolve().parents[2]
CLASSIC, QUORUM = "chaos.classic", "chaos.quorum"
STALE_TAG = re.compile(r"unknown delivery tag", re.I)
CLOSED_BY_BROKER = re.compile(r"channel closed by (the )?broker", re.I)
# RabbitMQ 4.3 ends a timed-out consumer with a basic.cancel instead of closing the
# channel (ackkit logs it with this line); chaos deletes no queue, so here it is a timeout
CANCELLED_BY_BROKER = re.compile(r"the broker cancelled the consumer", re.I)
PASS_KEYS = ("lost", "dead_letter_mismatch", "over_attempts", "stale_tag_channel_errors")


@dataclass
class Settings:
    messages: int = 100_000
    kills: int = 10
    restarts: int = 2
    cuts: int = 20
    consumers: int = 4
    slow: int = 3
    prefetch: int = 50
    backlog: int = 4000
    chunk: int = 1000
    consumer_timeout_ms: int = 6000
    slow_seconds: float = 9.0
    drain_timeout: float = 900.0
    seed: int = 7
    mode: str = "full"
    runtimes: tuple[str, ...] = ("sync", "async")
    """The consumers' runtimes, by slot in turn: "sync" (App), "async" (AsyncApp),
    "amqp10" (App over AMQP 1.0: RabbitMQ 4.0+)."""

    @classmethod
    def quick(cls) -> Settings:
        return cls(
            messages=6000,
            kills=3,
            restarts=1,
            cuts=5,
            slow=1,
            backlog=1500,
            chunk=500,
            drain_timeout=150.0,
            mode="quick",
        )


@dataclass
class Result:
    figures: dict[str, Any]
    workdir: str
    skipped: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        f = self.figures
        return self.skipped is None and all(f.get(k, 1) == 0 for k in (*PASS_KEYS, "queue_left"))


class Log:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.t0 = time.monotonic()

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            print(f"[chaos {time.monotonic() - self.t0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# -- the broker ----------------------------------------------------------------------


def configure_node(broker: BrokerHandle, consumer_timeout_ms: int) -> None:
    """Short consumer timeout, checked every second (set again after every restart)."""
    broker.eval_erlang(
        f"application:set_env(rabbit, consumer_timeout, {consumer_timeout_ms}), "
        "application:set_env(rabbit, channel_tick_interval, 1000)."
    )


def declare(url: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.queue_declare(CLASSIC, durable=True)
        ch.queue_declare(QUORUM, durable=True, arguments={"x-queue-type": "quorum"})
    finally:
        conn.close()


async def _publish(url: str, msgs: list[Message]) -> None:
    import aiormq
    from pamqp import commands as spec

    conn = await aiormq.connect(url)
    try:
        ch = await conn.channel(publisher_confirms=True)

        async def one(m: Message) -> None:
            props = spec.Basic.Properties(
                message_id=m.message_id,
                delivery_mode=2,
                content_type=m.content_type,
                headers=m.headers or None,
            )
            conf = await ch.basic_publish(m.body, routing_key=m.queue, properties=props)
            if not isinstance(conf, spec.Basic.Ack):
                raise RuntimeError(f"broker refused {m.message_id}: {conf!r}")

        await asyncio.gather(*(one(m) for m in msgs if m.raw_headers is None))
        raw = [m for m in msgs if m.raw_headers is not None]
        if raw:
            await asyncio.to_thread(_publish_raw, url, raw)
    finally:
        await conn.close()


def _publish_raw(url: str, msgs: list[Message]) -> None:
    """Messages whose header table no client library would encode (confirmed one by one)."""
    from tests.adversarial.rawamqp import RawClient

    with RawClient(url) as c:
        for m in msgs:
            props = {"message_id": m.message_id, "delivery_mode": 2}
            props["content_type"] = m.content_type
            c.publish("", m.queue, m.body, props, raw_headers_table_bytes=m.raw_headers)


def publish(url: str, msgs: list[Message]) -> None:
    asyncio.run(_publish(url, msgs))


def ready_now(url: str, queues: list[str]) -> dict[str, int]:
    """Ready counts the queues themselves report (passive declares): a quorum queue's
    counts in the broker's metrics lag behind, by seconds after a restart."""
    out: dict[str, int] = {}
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        for q in queues:
            out[q] = int(ch.queue_declare(q, passive=True).method.message_count)
    finally:
        conn.close()
    return out


def backlog(broker: BrokerHandle) -> tuple[int, int] | None:
    """(messages in the origin queues, in the retry delay queues), or None if unknown."""
    try:
        counts = broker.counts_all()
        if CLASSIC not in counts or QUORUM not in counts:
            return None
        names = [n for n in counts if n in (CLASSIC, QUORUM) or ".retry." in n]
        ready = ready_now(broker.url, names)
    except Exception:
        return None

    def total(n: str) -> int:
        return max(counts[n].total, ready[n] + counts[n].unacked)

    origin = total(CLASSIC) + total(QUORUM)
    delay = sum(total(n) for n in names if ".retry." in n)
    return origin, delay


def read_dlq(url: str, queue: str) -> list[tuple[str, str, float]]:
    """(message_id, ackkit-reason, dead-lettered-at) of every message in `queue` (taken out)."""
    out: list[tuple[str, str, float]] = []
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=500)
        left = ch.queue_declare(queue, passive=True).method.message_count
        for method, props, _body in ch.consume(queue, auto_ack=True, inactivity_timeout=3.0):
            if method is None:
                if ch.queue_declare(queue, passive=True).method.message_count == 0:
                    break
                continue
            h = props.headers or {}
            reason = _text(h.get("ackkit-reason")) or _xdeath_reason(h)
            at = _ts(h.get("ackkit-dead-lettered-at"))
            out.append((props.message_id or "?", reason, at))
            left -= 1
        ch.cancel()
    finally:
        conn.close()
    return out


def _text(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return "" if v is None else str(v)


def _xdeath_reason(h: dict[str, Any]) -> str:
    deaths = h.get("x-death") or []
    return f"x-death: {_text(deaths[0].get('reason'))}" if deaths else "(no reason)"


def _ts(v: Any) -> float:
    try:
        return dt.datetime.fromisoformat(_text(v)).timestamp()
    except ValueError:
        return 0.0


# -- consumers -----------------------------------------------------------------------


class Consumers:
    """The consumer processes: slot i runs runtime i of `Settings.runtimes` (in turn)."""

    def __init__(self, s: Settings, url: str, work: Path, log: Log) -> None:
        self.s, self.url, self.work, self.log = s, url, work, log
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.spawns = 0
        self.unexpected_exits = 0
        self.killed: set[int] = set()
        (work / "records").mkdir(parents=True, exist_ok=True)
        (work / "logs").mkdir(parents=True, exist_ok=True)

    def runtime(self, slot: int) -> str:
        return self.s.runtimes[slot % len(self.s.runtimes)]

    def spawn(self, slot: int) -> None:
        self.spawns += 1
        name = f"{slot}-{self.runtime(slot)}-{self.spawns:03d}"
        cmd = [
            sys.executable,
            "-m",
            os.environ.get("ACKKIT_CHAOS_CONSUMER", "tests.chaos.consumer"),  # debugging hook
            "--runtime",
            self.runtime(slot),
            "--url",
            self.url,
            "--classic",
            CLASSIC,
            "--quorum",
            QUORUM,
            "--record",
            str(self.work / "records" / f"{name}.rec"),
            "--prefetch",
            str(self.s.prefetch),
            "--slow-seconds",
            str(self.s.slow_seconds),
        ]
        with open(self.work / "logs" / f"{name}.log", "ab") as out:
            self.procs[slot] = subprocess.Popen(
                cmd,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def start_all(self) -> None:
        for slot in range(self.s.consumers):
            self.spawn(slot)

    def kill(self, rnd: random.Random) -> str:
        slot = rnd.choice(sorted(self.procs))
        p = self.procs[slot]
        self.killed.add(p.pid)
        with contextlib.suppress(ProcessLookupError):
            p.kill()
        p.wait()
        return f"slot {slot} ({self.runtime(slot)}, pid {p.pid})"

    def respawn_dead(self) -> None:
        for slot, p in list(self.procs.items()):
            if p.poll() is None:
                continue
            if p.pid not in self.killed:
                self.unexpected_exits += 1
                self.log(f"consumer slot {slot} (pid {p.pid}) exited with {p.returncode}")
            self.spawn(slot)

    def stop_all(self, timeout: float = 30.0) -> int:
        """SIGTERM (graceful shutdown); returns how many had to be killed after `timeout`."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        forced = 0
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                forced += 1
                p.kill()
                p.wait()
            else:
                if p.returncode not in (0, -signal.SIGTERM):
                    self.unexpected_exits += 1
        return forced


# -- the run -------------------------------------------------------------------------


@dataclass
class FaultPlan:
    at: float  # fraction of the messages consumed
    kind: str


def fault_plan(s: Settings, rnd: random.Random) -> list[FaultPlan]:
    faults = [FaultPlan(rnd.uniform(0.05, 0.9), "kill") for _ in range(s.kills)]
    faults += [FaultPlan(rnd.uniform(0.05, 0.9), "cut") for _ in range(s.cuts)]
    faults += [FaultPlan((i + 1) / (s.restarts + 1), "restart") for i in range(s.restarts)]
    return sorted(faults, key=lambda f: f.at)


def run(s: Settings, workdir: Path | None = None, *, quiet: bool = False) -> Result:
    log = Log(quiet)
    work = workdir or Path(tempfile.mkdtemp(prefix="ackkit-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        broker = provision_broker("own" if _has_server() else None, exclusive=True)
    except BrokerUnavailable as exc:
        return Result({}, str(work), skipped=f"no broker node of the suite's own: {exc}")
    with broker:
        log(f"broker node {broker.node_name} up: {broker.masked_url}; work dir {work}")
        version = broker.server_version()
        if "amqp10" in s.runtimes and int(version.split(".")[0]) < 4:
            return Result({}, str(work), skipped=f"AMQP 1.0 needs RabbitMQ 4.0+, not {version}")
        return _run(s, broker, work, log)


def _has_server() -> bool:
    from ackkit.testing._broker import _find_rabbitmq_server

    return _find_rabbitmq_server() is not None


def _run(s: Settings, broker: BrokerHandle, work: Path, log: Log) -> Result:
    from .proxy import Proxy

    started = time.monotonic()
    rnd = random.Random(s.seed)
    configure_node(broker, s.consumer_timeout_ms)
    declare(broker.url)
    msgs = plan(s.messages, (CLASSIC, QUORUM), slow=s.slow, seed=s.seed)
    proxy = Proxy(broker.amqp_port)
    url = f"amqp://guest:guest@127.0.0.1:{proxy.port}/%2f"
    consumers = Consumers(s, url, work, log)
    consumers.start_all()
    faults: list[Fault] = []
    todo = fault_plan(s, rnd)
    published = 0
    last_fault = 0.0
    cut_no = 0
    notes: list[str] = []
    log(f"{len(msgs)} messages, {len(todo)} faults planned, {s.consumers} consumers")

    def fire(kind: str, action: Callable[[], str]) -> None:
        nonlocal last_fault
        t0 = time.time()
        what = action()
        faults.append(Fault(t0, time.time(), kind))
        last_fault = time.monotonic()
        log(f"fault {len(faults)}: {kind} {what}")

    try:
        while todo or published < len(msgs):
            consumers.respawn_dead()
            bl = backlog(broker)
            if bl is None:
                time.sleep(0.5)
                continue
            in_queues = bl[0] + bl[1]
            consumed = published - in_queues
            limit = len(msgs)
            if todo:
                limit = min(limit, int(todo[0].at * len(msgs)) + s.backlog)
            if published < limit and in_queues < s.backlog:
                n = min(s.chunk, limit - published)
                publish(broker.url, msgs[published : published + n])
                published += n
                continue
            due = todo and consumed >= todo[0].at * len(msgs)
            gap = 4.0 if faults and faults[-1].kind == "restart" else 1.5
            if due and time.monotonic() - last_fault >= gap:
                f = todo.pop(0)
                if f.kind == "kill":
                    fire("kill", lambda: consumers.kill(rnd))
                elif f.kind == "cut":
                    cut_no += 1
                    if cut_no % 2:
                        fire("cut", lambda: f"proxy reset {proxy.cut()} connections")
                    else:
                        fire("cut", lambda: _close_all(broker))
                else:
                    fire("restart", lambda: _restart(broker, s))
                continue
            time.sleep(0.3)
        log(f"all published and all faults injected; draining (up to {s.drain_timeout:.0f} s)")
        drained = _drain(broker, consumers, s.drain_timeout, log)
        if not drained:
            notes.append(f"the queues did not drain within {s.drain_timeout:.0f} s")
    finally:
        forced = consumers.stop_all()
        proxy.close()
    if forced:
        notes.append(f"{forced} consumer(s) ignored SIGTERM for 30 s and were killed")
    counts = broker.counts_all()
    delays = [n for n in counts if ".retry." in n]
    ready = ready_now(broker.url, [CLASSIC, QUORUM, *delays])
    queue_left = sum(max(counts[q].ready, ready[q]) + counts[q].unacked for q in (CLASSIC, QUORUM))
    delay_left = sum(max(counts[n].total, ready[n]) for n in delays)
    dlq = read_dlq(broker.url, f"{CLASSIC}.dlq") + read_dlq(broker.url, f"{QUORUM}.dlq")
    (work / "dlq.json").write_text(json.dumps(dlq))
    figures = _figures(s, msgs, work, faults, dlq, broker)
    figures.update(
        queue_left=queue_left,
        delay_left=delay_left,
        kills=sum(f.kind == "kill" for f in faults),
        broker_restarts=sum(f.kind == "restart" for f in faults),
        cuts=sum(f.kind == "cut" for f in faults),
        consumer_processes=consumers.spawns,
        unexpected_exits=consumers.unexpected_exits,
        seconds=round(time.monotonic() - started, 1),
        mode=s.mode,
    )
    result = Result(figures, str(work), notes=notes)
    figures["pass"] = result.passed
    (work / "faults.json").write_text(json.dumps([asdict(f) for f in faults], indent=1))
    return result


def _close_all(broker: BrokerHandle) -> str:
    broker.close_connections("chaos: connection cut")
    return "broker closed all connections"


def _restart(broker: BrokerHandle, s: Settings) -> str:
    t = time.monotonic()
    broker.restart()
    configure_node(broker, s.consumer_timeout_ms)
    return f"broker node restarted in {time.monotonic() - t:.1f} s"


def _drain(broker: BrokerHandle, consumers: Consumers, timeout: float, log: Log) -> bool:
    deadline = time.monotonic() + timeout
    quiet = 0
    last_report = 0.0
    while time.monotonic() < deadline:
        consumers.respawn_dead()
        bl = backlog(broker)
        if bl is not None and bl == (0, 0):
            quiet += 1
            if quiet >= 4:
                return True
        else:
            quiet = 0
            if bl is not None and time.monotonic() - last_report > 10:
                last_report = time.monotonic()
                log(f"draining: {bl[0]} in the origin queues, {bl[1]} in delay queues")
        time.sleep(1.0)
    return False


def _figures(
    s: Settings,
    msgs: list[Message],
    work: Path,
    faults: list[Fault],
    dlq: list[tuple[str, str, float]],
    broker: BrokerHandle,
) -> dict[str, Any]:
    stories: dict[str, Story] = {}
    garbled = 0
    for rec in sorted((work / "records").glob("*.rec")):
        with open(rec, encoding="ascii", errors="replace") as fh:
            garbled += parse_records(fh, stories)
    unknown = 0
    known = {m.message_id for m in msgs}
    for mid, reason, at in dlq:
        if mid not in known:
            unknown += 1
            continue
        stories.setdefault(mid, Story()).dead.append((reason, at))
    stale_consumers = 0
    timeouts = 0
    for lf in sorted((work / "logs").glob("*.log")):
        for line in lf.read_text(encoding="utf-8", errors="replace").splitlines():
            if STALE_TAG.search(line) and CLOSED_BY_BROKER.search(line):
                stale_consumers += 1  # ackkit's own line about the closure (pika logs one too)
            timed_out = CLOSED_BY_BROKER.search(line) and "timed out" in line
            if timed_out or CANCELLED_BY_BROKER.search(line):
                timeouts += 1
                with contextlib.suppress(ValueError, IndexError):
                    t = float(line.split()[0])
                    faults.append(Fault(t - s.consumer_timeout_ms / 1000, t, "timeout"))
    broker_log = broker.log_text() or ""
    (work / "broker.log").write_text(broker_log)
    # Each closure shows in the broker log and in the consumer's log: count it once.
    stale = max(stale_consumers, len(STALE_TAG.findall(broker_log)))
    expected = OVER_AMQP10 if set(s.runtimes) == {"amqp10"} else EXPECTED_REASON
    fig = analyse(
        [m.message_id for m in msgs], stories, faults, RETRY.max_attempts, expected=expected
    )
    fig = {
        "messages": len(msgs),
        "poison": fig.get("poison", 0),
        "bad": fig.get("bad", 0),
        "hostile": fig.get("hostile", 0),
        "slow": fig.get("slow", 0),
        "kills": 0,
        "broker_restarts": 0,
        "cuts": 0,
        "consumer_timeouts": timeouts,
        "handled_ok": fig.get("handled_ok", 0),
        "lost": fig.get("lost", 0),
        "duplicates": fig.get("duplicates", 0),
        "dead_lettered": fig.get("dead_lettered", 0),
        "dead_letter_mismatch": fig.get("dead_letter_mismatch", 0),
        "over_attempts": fig.get("over_attempts", 0),
        "stale_tag_channel_errors": stale,
        "queue_left": 0,
        "good_dead_lettered": fig.get("good_dead_lettered", 0),
        "good_dead_lettered_unexpected": fig.get("good_dead_lettered_unexpected", 0),
        "dead_lettered_after_losses": fig.get("dead_lettered_after_losses", 0),
        "dlq_duplicates": fig.get("dlq_duplicates", 0),
        "handler_runs": fig.get("runs", 0),
        "reruns": fig.get("reruns", 0),
        "unexplained_reruns": fig.get("unexplained_reruns", 0),
        "unknown_dead_letters": unknown,
        "garbled_record_lines": garbled,
    }
    return fig


# -- report --------------------------------------------------------------------------


def table(r: Result) -> str:
    if r.skipped:
        return f"chaos run skipped: {r.skipped}"
    f = r.figures
    width = max(len(k) for k in f)
    lines = [f"ackkit chaos run ({f.get('mode')}, {f.get('seconds')} s)", "-" * (width + 12)]
    for k, v in f.items():
        if k in ("mode", "seconds", "pass"):
            continue
        mark = ""
        if k in (*PASS_KEYS, "queue_left"):
            mark = "  ok" if v == 0 else "  FAIL"
        lines.append(f"{k:<{width}}  {v!s:>8}{mark}")
    lines.append("-" * (width + 12))
    lines.append("PASS" if r.passed else "FAIL")
    lines.extend(f"note: {n}" for n in r.notes)
    lines.append(f"records and logs: {r.workdir}")
    return "\n".join(lines)
