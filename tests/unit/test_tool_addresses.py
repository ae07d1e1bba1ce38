"""The tools given several node addresses (no broker): the forms each one takes (a list,
the comma form, --url repeated, AMQP_URL with spaces, a Spark option string), the order
they try the nodes in, what they refuse, and masked passwords in what they print.

The parsing itself is `ackkit._connection.addresses` (tests/unit/test_addresses.py);
here: that each tool hands its addresses to it and connects in the given order."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pika.exceptions
import pytest

from ackkit._connection import addresses
from ackkit._connection.io import connect_in_turn

PW = "s3cret-pw"
A = f"amqp://ops:{PW}@h1:5672/prod"
B = f"amqp://ops:{PW}@h2:5673/prod"
C = f"amqp://ops:{PW}@h3:5674/prod"
COMMA = f"amqp://ops:{PW}@h1:5672,h2:5673,h3:5674/prod"
OTHER_VHOST = f"amqp://ops:{PW}@h2:5673/test"


class Refused(pika.exceptions.AMQPConnectionError):
    pass


def dialer(answers: str, tried: list[str]) -> Any:
    """A connect function: the addresses of `answers` (by host) answer, the others
    refuse; every address asked is recorded."""

    def connect(url: str) -> Any:
        tried.append(url)
        host = url.split("@")[1].split(":")[0]
        if host not in answers:
            raise Refused(f"connection to {url} refused")
        return f"conn:{host}"

    return connect


# -- the shared loop ---------------------------------------------------------------------


def test_connect_in_turn_tries_each_node_once_from_the_current_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rotation = addresses.Rotation((A, B, C))
    tried: list[str] = []
    with caplog.at_level(logging.WARNING, "ackkit"):
        conn = connect_in_turn(rotation, dialer("h3", tried), what="test")
    assert conn == "conn:h3"
    assert tried == [A, B, C]
    assert rotation.current == C  # left on the node that answered
    assert "node address 1 of 3" in caplog.text and "node address 2 of 3" in caplog.text
    assert PW not in caplog.text and "ops:***@h1" in caplog.text

    tried.clear()  # next time it starts where it is, wrapping
    rotation.advance()
    assert connect_in_turn(rotation, dialer("h2", tried)) == "conn:h2"
    assert tried == [A, B]


def test_connect_in_turn_raises_the_last_error_or_a_final_one_at_once() -> None:
    tried: list[str] = []
    with pytest.raises(Refused, match="h3"):
        connect_in_turn(addresses.Rotation((A, B, C)), dialer("", tried))
    assert tried == [A, B, C]

    class Denied(Refused):
        pass

    def denied(url: str) -> Any:
        tried.append(url)
        raise Denied("ACCESS_REFUSED")

    tried.clear()
    with pytest.raises(Denied):
        connect_in_turn(addresses.Rotation((A, B, C)), denied, final=(Denied,))
    assert tried == [A]  # the same user on every node: no point in the others


# -- ackkit dlq / DeadLetterQueue -----------------------------------------------------------


def test_dead_letter_queue_connects_to_the_first_node_that_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ackkit.dead_letters import _queue

    tried: list[str] = []
    connect = dialer("h2", tried)
    monkeypatch.setattr(_queue, "parameters", lambda url, name: url)
    monkeypatch.setattr(_queue, "blocking_connection", connect)
    for given in (COMMA, [A, B, C], [A, f"amqp://ops:{PW}@h2:5673,h3:5674/prod"]):
        tried.clear()
        dlq = _queue.DeadLetterQueue(given, "orders.dlq")
        assert dlq.urls == (A, B, C)
        assert tried == [A, B]
        assert dlq.url == B  # the node it is connected to
        dlq._conn = None
    with pytest.raises(ValueError, match="virtual host") as exc:
        _queue.DeadLetterQueue([A, OTHER_VHOST], "orders.dlq")
    assert PW not in str(exc.value)


def test_safe_error_masks_every_nodes_password() -> None:
    from ackkit.dead_letters._queue import safe_error

    other = "amqp://ops:another-pw@h2:5673/prod"
    text = safe_error(RuntimeError(f"{PW} and another-pw"), [A, other])
    assert PW not in text and "another-pw" not in text


def cli_calls(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[Any]]:
    """The CLI with DeadLetterQueue replaced by one recording the addresses it is given
    (and failing like a broker that is down, password in the message)."""
    from ackkit.cli import build_cli
    from ackkit.dead_letters import _queue

    given: list[Any] = []

    class Recording:
        def __init__(self, url: Any, queue: str, **_: Any) -> None:
            given.append(url)
            raise ConnectionRefusedError(f"no node answered: {A}")

    monkeypatch.setattr(_queue, "DeadLetterQueue", Recording)
    return build_cli(), given


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--url", A, "--url", B, "--url", C], None),
        (["--url", COMMA], None),
        (["--url", A, "--url", f"amqp://ops:{PW}@h2:5673,h3:5674/prod"], None),
        ([], COMMA),
        ([], f"{A} {B}  {C}"),  # AMQP_URL: URLs separated by spaces
    ],
)
def test_cli_dlq_commands_take_every_form(
    monkeypatch: pytest.MonkeyPatch, args: list[str], env: str | None
) -> None:
    from typer.testing import CliRunner

    cli, given = cli_calls(monkeypatch)
    runner = CliRunner()
    envs = {"AMQP_URL": env} if env else {}
    for cmd in (["dlq", "inspect", "orders.dlq"], ["dlq", "replay", "orders.dlq"]):
        res = runner.invoke(cli, [*cmd, *args], env=envs)
        assert res.exit_code == 1, res.output
        assert PW not in res.output and "no node answered" in res.output
    assert given == [(A, B, C)] * 2  # parsed once, in the given order


def test_cli_refuses_mismatched_addresses_before_connecting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typer.testing import CliRunner

    cli, given = cli_calls(monkeypatch)
    runner = CliRunner()
    for cmd in (["dlq", "inspect", "q.dlq"], ["queues", "q"]):
        res = runner.invoke(cli, [*cmd, "--url", A, "--url", OTHER_VHOST])
        assert res.exit_code == 2, res.output
        assert "virtual host" in res.output and PW not in res.output
        res = runner.invoke(cli, [*cmd, "--url", f"amqp://ops:{PW}@h1:5672,,h3/prod"])
        assert res.exit_code == 2 and "empty host" in res.output and PW not in res.output
    assert given == []


# -- ackkit queues ---------------------------------------------------------------------------


def test_queues_ask_the_nodes_in_order_until_one_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    from ackkit.cli import _queues

    asked: list[str] = []

    def management(t: Any, base: str | None, timeout: float) -> list[Any]:
        asked.append(t.host)
        if t.host != "h3":
            raise _queues.QueueSourceError(f"management API at http://{t.host}:15672 down {PW}")
        return [_queues.QueueRow("orders", 1, 2, 3, 1)]

    monkeypatch.setattr(_queues, "_management", management)
    listing = _queues.list_queues([A, B, C], ["orders"], source="management")
    assert asked == ["h1", "h2", "h3"]
    assert listing.source == "management" and listing.node == "amqp://ops:***@h3:5674/prod"
    assert [r.name for r in listing.rows] == ["orders"]
    assert len(listing.notes) == 2 and all(PW not in n for n in listing.notes)
    assert listing.notes[0].startswith("management: amqp://ops:***@h1")

    asked.clear()  # every node down: one error naming each, password masked
    with pytest.raises(_queues.QueueSourceError) as exc:
        _queues.list_queues(f"amqp://ops:{PW}@h1,h2/prod", ["orders"], source="management")
    assert asked == ["h1", "h2"] and PW not in str(exc.value) and "h2" in str(exc.value)

    asked.clear()  # the same host twice (nodes on one machine): its API is asked once
    one_host = f"amqp://ops:{PW}@h1:5672,h1:5673,h3:5674/prod"
    assert _queues.list_queues(one_host, source="management").node.endswith("@h3:5674/prod")
    assert asked == ["h1", "h3"]


def test_queues_over_amqp_connect_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    from ackkit._sync import _pika
    from ackkit.cli import _queues

    tried: list[str] = []
    connect = dialer("h2", tried)

    class Conn:
        def channel(self) -> Any:
            return object()

        def close(self) -> None:
            pass

    monkeypatch.setattr(_pika, "parameters", lambda url, name: url)
    monkeypatch.setattr(_pika, "blocking_connection", lambda u: connect(u) and Conn())
    monkeypatch.setattr(_pika, "passive_declare", lambda ch, name: None)
    listing = _queues.list_queues(COMMA, ["orders"], source="amqp")
    assert tried == [A, B]
    assert listing.node == "amqp://ops:***@h2:5673/prod" and listing.missing == ["orders"]


# -- the console --------------------------------------------------------------------------


def test_console_options_take_every_form() -> None:
    from ackkit.console._serve import from_options

    def opts(url: Any) -> Any:
        return from_options(
            url=url, dlqs=["orders.dlq"], app_target=None, host="127.0.0.1",
            token=None, basic_auth=None, read_only=True,
        )[0]  # fmt: skip

    assert opts([A]) == A  # one address: the URL as before
    assert opts(COMMA) == (A, B, C)
    assert opts([A, B, C]) == (A, B, C)
    assert opts([COMMA]) == (A, B, C)
    with pytest.raises(ValueError, match="user") as exc:
        opts([A, f"amqp://root:{PW}@h2/prod"])
    assert PW not in str(exc.value)


def test_console_holder_tries_every_node_then_says_what_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ackkit.console import _holder
    from ackkit.console._store import Store

    tried: list[str] = []
    monkeypatch.setattr(_holder, "parameters", lambda url, name: url)
    monkeypatch.setattr(_holder, "blocking_connection", dialer("", tried))
    h = _holder.Holder([A, B, C], ["orders.dlq"], Store(["orders.dlq"]))
    assert h.url == A and h.urls == (A, B, C)
    assert h.safe_url == "amqp://ops:***@h1:5672/prod, amqp://ops:***@h2:5673/prod, " + (
        "amqp://ops:***@h3:5674/prod"
    )
    assert h.waiting_for() == f"connecting to {h.safe_url} (waiting for the broker)"
    with pytest.raises(Refused, match="h3"):
        h.start(timeout=10)
    assert tried == [A, B, C]


def test_console_page_shows_every_node_masked() -> None:
    pytest.importorskip("starlette", reason="the console extra is not installed")
    from starlette.testclient import TestClient

    from ackkit.console import Store, create_app

    class Holder:
        url = A
        urls = (A, B)
        safe_url = addresses.describe((A, B))
        store = Store(["orders.dlq"])
        ready_counts = {"orders.dlq": 0}

    page = TestClient(create_app(Holder()), base_url="http://127.0.0.1:8470").get("/").text
    assert "amqp://ops:***@h1:5672/prod, amqp://ops:***@h2:5673/prod" in page
    assert PW not in page


# -- the outbox relay -----------------------------------------------------------------------


def test_relay_starts_with_the_next_node_after_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    from ackkit._sync import pull
    from ackkit.inbox import Inbox, _relay

    given: list[tuple[str, ...]] = []
    stop = threading.Event()

    class Pull:
        def __init__(self, urls: Any) -> None:
            given.append(tuple(urls))
            if len(given) == 1:
                raise ConnectionRefusedError(f"no node answered: {A}")

        def publish_message(self, *_: Any) -> None:
            pass

        def close(self) -> None:
            pass

    class Db:
        closed = broken = False

        def close(self) -> None:
            pass

    def once(*_: Any) -> int:
        stop.set()
        return 0

    monkeypatch.setattr(pull, "PullConnection", Pull)
    monkeypatch.setattr(_relay, "relay_connection", lambda inbox: Db())
    monkeypatch.setattr(_relay, "relay_once", once)
    monkeypatch.setattr(_relay, "probe_delay", lambda fails: 0.01)
    inbox = Inbox("postgresql://u:p@localhost/db", retention=None)
    assert _relay.run_relay(COMMA, inbox, stop=stop, poll=0.01) == 0
    assert given == [(A, B, C), (B, C, A)]  # every node, the next one first

    with pytest.raises(ValueError, match="virtual host"):
        _relay.run_relay([A, OTHER_VHOST], inbox, once=True)


def test_cli_outbox_relay_takes_every_form(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from ackkit.cli import build_cli
    from ackkit.inbox import _relay

    given: list[Any] = []

    def run_relay(urls: Any, inbox: Any, **_: Any) -> int:
        given.append(urls)
        return 0

    monkeypatch.setattr(_relay, "run_relay", run_relay)
    dsn = ["--dsn", "postgresql://u:p@localhost/db", "--once"]
    runner = CliRunner()
    for args, env in (
        (["--url", A, "--url", B], {}),
        (["--url", f"amqp://ops:{PW}@h1:5672,h2:5673/prod"], {}),
        ([], {"AMQP_URL": f"{A} {B}"}),
    ):
        res = runner.invoke(build_cli(), ["outbox", "relay", *dsn, *args], env=env)
        assert res.exit_code == 0, res.output
        assert "relay to amqp://ops:***@h1:5672/prod, amqp://ops:***@h2:5673/prod" in res.output
        assert PW not in res.output
    assert given == [(A, B)] * 3
    res = runner.invoke(build_cli(), ["outbox", "relay", *dsn, "--url", A, "--url", OTHER_VHOST])
    assert res.exit_code == 2 and "virtual host" in res.output and PW not in res.output


# -- the Spark sources' options ----------------------------------------------------------------


def test_spark_queue_source_url_option_forms(tmp_path: Any) -> None:
    from ackkit.spark._options import SourceOptions, url_option

    base = {"queue": "orders", "checkpoint": str(tmp_path)}
    one = SourceOptions.parse({**base, "url": A})
    assert (one.url, one.urls) == (A, (A,))
    for given in (COMMA, f"{A} {B} {C}", f" {A}\n{B}  {C} "):
        o = SourceOptions.parse({**base, "url": given})
        assert (o.url, o.urls) == (A, (A, B, C))
    assert url_option([A, B, C]) == f"{A} {B} {C}" and url_option(COMMA) == COMMA
    assert SourceOptions.parse({**base, "url": url_option([A, B, C])}).urls == (A, B, C)
    with pytest.raises(ValueError, match="virtual host") as exc:
        SourceOptions.parse({**base, "url": f"{A} {OTHER_VHOST}"})
    assert PW not in str(exc.value)
    assert SourceOptions(url=A, queue="q", checkpoint=str(tmp_path)).urls == (A,)


def test_spark_stream_source_lists_every_nodes_host(tmp_path: Any) -> None:
    from ackkit.spark._stream_options import StreamSourceOptions

    base = {"stream": "events", "checkpoint": str(tmp_path), "stream_port": "5552"}
    one = StreamSourceOptions.parse({**base, "url": A})
    assert one.urls == (A,) and "hosts" not in one.connection
    o = StreamSourceOptions.parse({**base, "url": COMMA})
    assert o.url == A and o.urls == (A, B, C)
    conn = o.connection
    assert conn["host"] == "h1" and conn["port"] == 5552 and conn["hosts"] == ("h1", "h2", "h3")
    assert conn["vhost"] == "prod" and conn["password"] == PW
