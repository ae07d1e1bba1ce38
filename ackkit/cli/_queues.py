"""Queue counts like `rabbitmqctl list_queues name messages_ready messages_unacknowledged
messages consumers`, from whichever source answers:

1. the management API (HTTP, the AMQP URL's credentials), when the plugin answers;
2. `rabbitmqctl`, when the broker runs on this machine and the node it reaches is
   the one listening on the URL's port;
3. AMQP itself: a passive declare per named queue gives ready and consumers only
   (AMQP cannot list queues, nor count unacknowledged messages).

Every answer says which source it came from. Given several node addresses (a
cluster), each source asks the nodes in the given order until one answers.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .._connection import addresses
from .._connection.url import mask_text, mask_url

SOURCES = ("auto", "management", "rabbitmqctl", "amqp")
COUNTS = ("messages_ready", "messages_unacknowledged", "messages", "consumers")
"""A queue's counts as rabbitmqctl and the management API name them: ready, unacked,
total and consumers, in `QueueRow`'s order."""
_SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin", "/usr/lib/rabbitmq/bin", "/opt/homebrew/sbin")


class QueueSourceError(Exception):
    """A source could not answer (the message says why, password masked)."""


@dataclass(frozen=True, slots=True)
class QueueRow:
    name: str
    ready: int | None
    unacked: int | None
    total: int | None
    consumers: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class QueueListing:
    source: str
    rows: list[QueueRow]
    notes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    """Queues asked for by name that do not exist (`ackkit queues` exits 1)."""
    node: str = ""
    """The node address that answered, password masked."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "queues": [r.to_dict() for r in self.rows],
            "notes": list(self.notes),
        }


@dataclass(frozen=True, slots=True)
class _Target:
    scheme: str
    host: str
    port: int
    user: str
    password: str
    vhost: str

    @staticmethod
    def parse(url: str) -> _Target:
        p = urllib.parse.urlsplit(url)
        tls = p.scheme == "amqps"
        vhost = urllib.parse.unquote(p.path[1:]) if len(p.path) > 1 else "/"
        return _Target(
            p.scheme,
            p.hostname or "localhost",
            p.port or (5671 if tls else 5672),
            urllib.parse.unquote(p.username or "guest"),
            urllib.parse.unquote(p.password or "guest"),
            vhost,
        )

    @property
    def local(self) -> bool:
        return self.host in ("localhost", "127.0.0.1", "::1", "0.0.0.0")


def _mask(text: str, t: _Target) -> str:
    return mask_text(text, t.password if t.password not in ("", "guest") else "")


def list_queues(
    url: str | Sequence[str],
    names: Sequence[str] = (),
    *,
    source: str = "auto",
    management_url: str | None = None,
    node: str | None = None,
    timeout: float = 5.0,
) -> QueueListing:
    """Counts of the vhost's queues (or only `names`), from the first source that answers.

    `url`: one URL, the comma form or a list (`ackkit._connection.addresses`); each
    source asks the nodes in order until one answers."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}")
    urls = addresses.parse(url)
    several = len(urls) > 1
    notes: list[str] = []
    order = ["management", "rabbitmqctl", "amqp"] if source == "auto" else [source]
    for src in order:
        if src == "amqp":
            if not names:
                exc = QueueSourceError(
                    "AMQP cannot list queues: name the queues to count "
                    "(ready and consumers only; AMQP does not count unacked messages)"
                )
                if source != "auto":
                    raise exc
                notes.append(f"amqp: {exc}")
                continue
            answered, rows = _amqp(urls, names)
            missing = [r.name for r in rows if r.ready is None]
            if missing:
                notes.append(f"not found: {', '.join(missing)}")
            return QueueListing("amqp", rows, notes, missing, answered)
        asked: set[object] = set()
        for u in urls:
            t = _Target.parse(u)
            key = (management_url or t.host) if src == "management" else (t.host, t.port)
            if key in asked:  # one management API serves every node of a host
                continue
            asked.add(key)
            try:
                if src == "management":
                    rows = _management(t, management_url, timeout)
                else:
                    rows = _rabbitmqctl(t, node, timeout=max(timeout, 30.0))
            except QueueSourceError as exc:
                if source != "auto" and not several:
                    raise
                where = f"{mask_url(u)}: " if several else ""
                notes.append(f"{src}: {where}{_mask(str(exc), t)}")
                continue
            return _listing(src, rows, names, notes, mask_url(u))
        if source != "auto":
            raise QueueSourceError("; ".join(notes))
    raise QueueSourceError("no source answered: " + "; ".join(notes))


def _listing(
    src: str, rows: list[QueueRow], names: Sequence[str], notes: list[str], node: str
) -> QueueListing:
    """The listing of `rows` from `src`, only `names` when given (the missing ones too)."""
    missing = []
    if names:
        wanted = set(names)
        missing = [n for n in names if n not in {r.name for r in rows}]
        rows = [r for r in rows if r.name in wanted]
        rows += [QueueRow(n, None, None, None, None) for n in missing]
        if missing:
            notes.append(f"not found: {', '.join(missing)}")
    return QueueListing(src, sorted(rows, key=lambda r: r.name), notes, missing, node)


def _management(t: _Target, management_url: str | None, timeout: float) -> list[QueueRow]:
    base = management_url or f"{'https' if t.scheme == 'amqps' else 'http'}://{t.host}:15672"
    vhost = urllib.parse.quote(t.vhost, safe="")
    cols = ",".join(("name", *COUNTS))
    url = f"{base.rstrip('/')}/api/queues/{vhost}?columns={cols}"
    req = urllib.request.Request(url)
    token = base64.b64encode(f"{t.user}:{t.password}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data = json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        raise QueueSourceError(f"management API at {base} answered {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise QueueSourceError(f"management API at {base} did not answer ({exc})") from None
    if not isinstance(data, list):
        raise QueueSourceError(f"management API at {base}: unexpected answer")
    return [_row(d) for d in data if isinstance(d, dict) and "name" in d]


def _row(d: dict[str, Any]) -> QueueRow:
    def num(k: str) -> int | None:
        v = d.get(k)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    return QueueRow(str(d["name"]), *(num(k) for k in COUNTS))


def ctl_list_queues(vhost: str) -> tuple[str, ...]:
    """The arguments of `rabbitmqctl list_queues` that print each queue of `vhost`, its
    name and `COUNTS`, as a JSON list (the test kit asks the same)."""
    return ("list_queues", "-p", vhost, "--formatter", "json", "--quiet", "name", *COUNTS)


def _ctl_path() -> str | None:
    path = os.pathsep.join([os.environ.get("PATH", ""), *_SBIN])
    return shutil.which("rabbitmqctl", path=path)


def _ctl(exe: str, node: str | None, *args: str, timeout: float) -> str:
    cmd = [exe, *(["-n", node] if node else []), *args]
    try:
        res = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=tempfile.gettempdir(),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise QueueSourceError(f"rabbitmqctl failed: {exc}") from None
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
        raise QueueSourceError(f"rabbitmqctl exited {res.returncode}: {' '.join(tail)}")
    return res.stdout


def _json_tail(text: str, opener: str) -> Any:
    start = text.find(opener)
    if start < 0:
        raise QueueSourceError(f"rabbitmqctl: unexpected output {text[:200]!r}")
    try:
        return json.loads(text[start:])
    except ValueError:
        raise QueueSourceError(f"rabbitmqctl: unexpected output {text[:200]!r}") from None


def _rabbitmqctl(t: _Target, node: str | None, timeout: float) -> list[QueueRow]:
    if not t.local and not node:
        raise QueueSourceError(f"broker {t.host} is not on this machine (give --node)")
    exe = _ctl_path()
    if exe is None:
        raise QueueSourceError("rabbitmqctl is not installed")
    if not node:
        # The default node must be the broker of the URL, not another one on this host.
        status = _json_tail(_ctl(exe, None, "status", "--formatter", "json", timeout=timeout), "{")
        ports = {
            int(x["port"])
            for x in status.get("listeners", [])
            if isinstance(x, dict) and "amqp" in str(x.get("protocol", ""))
        }
        if ports and t.port not in ports:
            raise QueueSourceError(
                f"the local node listens on {sorted(ports)}, not on port {t.port} (give --node)"
            )
    text = _ctl(exe, node, *ctl_list_queues(t.vhost), timeout=timeout)
    data = _json_tail(text, "[")
    return [_row(d) for d in data if isinstance(d, dict) and "name" in d]


def _amqp(urls: Sequence[str], names: Sequence[str]) -> tuple[str, list[QueueRow]]:
    """The node that answered (masked) and a passive declare's counts per queue."""
    import pika
    import pika.exceptions

    from .._connection.io import connect_in_turn
    from .._sync._pika import blocking_connection, parameters, passive_declare

    rows: list[QueueRow] = []
    rotation = addresses.Rotation(urls)
    conn = connect_in_turn(  # memory:// too
        rotation,
        lambda u: blocking_connection(parameters(u, name="ackkit-queues")),
        final=(
            pika.exceptions.ProbableAuthenticationError,
            pika.exceptions.ProbableAccessDeniedError,
        ),
        what="ackkit queues",
    )
    try:
        for name in names:
            ch = conn.channel()
            frame = passive_declare(ch, name)
            if frame is None:
                rows.append(QueueRow(name, None, None, None, None))
                continue
            ok = frame.method
            rows.append(QueueRow(name, int(ok.message_count), None, None, int(ok.consumer_count)))
            with contextlib.suppress(pika.exceptions.AMQPError):
                ch.close()
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError):
            conn.close()
    return mask_url(rotation.current), rows
