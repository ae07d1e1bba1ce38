"""Security basics on a real broker: amqps with verified certificates (and client
certificates) on both runtimes, no password in any output, body limits and content
types on both runtimes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
import traceback
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from _apps import Runner
from _certs import CA, Issued
from _retry_support import drain, header_text, publish, wait_until

import ackkit
from ackkit import TLS, App, AsyncApp, Consumer, Delivery
from ackkit._connection.io import ConnectFailed, FatalConnectError
from ackkit._core import headers as H
from ackkit.observability import mask_url
from ackkit.testing import BrokerHandle, BrokerUnavailable, NodeTLS, provision_broker

pytestmark = pytest.mark.integration


# -- TLS ---------------------------------------------------------------------------------


class TLSNode:
    def __init__(self, broker: BrokerHandle, ca: CA, client: Issued, wrong: CA) -> None:
        self.broker = broker
        self.url = str(broker.amqps_url)
        self.ca = ca
        self.client = client
        self.wrong = wrong

    def tls(self, **kw: Any) -> TLS:
        base: dict[str, Any] = {
            "ca_file": str(self.ca.cert),
            "cert_file": str(self.client.cert),
            "key_file": str(self.client.key),
        }
        return TLS(**{**base, **kw})


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSNode]:
    """A node of the kit's own with an amqps listener that wants client certificates."""
    d = tmp_path_factory.mktemp("tls")
    ca = CA(d, "ackkit-test-ca")
    wrong = CA(d, "some-other-ca")
    server = ca.issue("server", server=True, hosts=("localhost", "127.0.0.1"))
    client = ca.issue("client", server=False)
    files = NodeTLS(str(ca.cert), str(server.cert), str(server.key), fail_if_no_peer_cert=True)
    try:
        broker = provision_broker("own", tls=files)
    except BrokerUnavailable as exc:
        pytest.skip(f"a TLS listener needs a broker node of the kit's own: {exc}")
    with broker:
        yield TLSNode(broker, ca, client, wrong)


def _consume_one(app: App | AsyncApp, node: TLSNode, queue: str, got: list[str]) -> None:
    runner = Runner(app)
    runner.start()
    try:
        with ackkit.connect(node.url, tls=node.tls()) as c:
            c.publish(queue, b'{"n": 1}', message_id="over-tls")
        assert wait_until(lambda: got == ["over-tls"], timeout=20)
        node.broker.wait_for(queue, ready=0, unacked=0, timeout=10)
    finally:
        runner.stop()


@pytest.mark.parametrize("runtime", ["sync", "async"])
def test_consume_over_amqps_with_a_verified_server_and_a_client_certificate(
    tls_node: TLSNode, runtime: str
) -> None:
    got: list[str] = []
    q = f"tls.{runtime}"
    app: App | AsyncApp
    if runtime == "sync":
        app = App(tls_node.url, tls=tls_node.tls())

        @app.listener(q)
        def handle(body: dict[str, int], d: Delivery) -> None:
            got.append(d.message_id or "")

    else:
        app = AsyncApp(tls_node.url, tls=tls_node.tls())

        @app.listener(q)
        async def ahandle(body: dict[str, int], d: Delivery) -> None:
            got.append(d.message_id or "")

    _consume_one(app, tls_node, q, got)


def test_an_ssl_context_of_ones_own_is_accepted(tls_node: TLSNode) -> None:
    ctx = ssl.create_default_context(cafile=str(tls_node.ca.cert))
    ctx.load_cert_chain(str(tls_node.client.cert), str(tls_node.client.key))
    got: list[str] = []
    app = App(tls_node.url, tls=ctx)

    @app.listener("tls.context")
    def handle(d: Delivery) -> None:
        got.append(d.message_id or "")

    _consume_one(app, tls_node, "tls.context", got)


def test_async_pull_over_amqps(tls_node: TLSNode) -> None:
    async def main() -> str | None:
        async with ackkit.aconnect(tls_node.url, tls=tls_node.tls()) as c:
            await c.declare_queue("tls.apull")
            await c.publish("tls.apull", b"{}", message_id="apull")
            d = await c.get("tls.apull")
            assert d is not None
            await d.ack()
            return d.message_id

    assert asyncio.run(main()) == "apull"


def _refused(runtime: str, url: str, tls: TLS) -> BaseException:
    """What connecting with `tls` raises, for each way of connecting."""
    started = time.monotonic()
    with pytest.raises(FatalConnectError) as info:
        if runtime == "sync":
            app = App(url, tls=tls, startup_timeout=120)
            app.listener("tls.never")(lambda d: None)
            app.start()
        elif runtime == "async":
            aapp = AsyncApp(url, tls=tls, startup_timeout=120)

            @aapp.listener("tls.never")
            async def never(d: Delivery) -> None: ...

            Runner(aapp).start()
        elif runtime == "pull":
            with ackkit.connect(url, tls=tls):
                pass
        else:

            async def main() -> None:
                async with ackkit.aconnect(url, tls=tls):
                    pass

            asyncio.run(main())
    # at once, not after startup_timeout of retrying: no retry fixes a certificate
    assert time.monotonic() - started < 30  # startup_timeout is 120 s
    return info.value


@pytest.mark.parametrize("runtime", ["sync", "async", "pull", "apull"])
def test_a_server_certificate_from_another_ca_fails_at_once_and_clearly(
    tls_node: TLSNode, runtime: str
) -> None:
    exc = _refused(runtime, tls_node.url, tls_node.tls(ca_file=str(tls_node.wrong.cert)))
    text = str(exc)
    assert text.startswith("TLS: the certificate of amqps://guest:***@127.0.0.1:")
    assert "self-signed certificate in certificate chain" in text
    assert "TLS(ca_file=...)" in text


@pytest.mark.parametrize("runtime", ["sync", "async"])
def test_a_certificate_for_another_host_name_fails_clearly(tls_node: TLSNode, runtime: str) -> None:
    exc = _refused(runtime, tls_node.url, tls_node.tls(server_hostname="mq.elsewhere.example"))
    assert "Hostname mismatch" in str(exc) and "mq.elsewhere.example" in str(exc)


def test_server_hostname_names_the_certificate_to_expect(tls_node: TLSNode) -> None:
    """Connecting to 127.0.0.1 while checking the certificate for 'localhost'."""
    with ackkit.connect(tls_node.url, tls=tls_node.tls(server_hostname="localhost")) as c:
        c.declare_queue("tls.sni")


def test_amqps_without_a_client_certificate_is_refused_by_this_broker(
    tls_node: TLSNode,
) -> None:
    app = App(tls_node.url, tls=TLS(ca_file=str(tls_node.ca.cert)), startup_timeout=5)
    app.listener("tls.never")(lambda d: None)
    with pytest.raises((FatalConnectError, ConnectFailed)):
        app.start()


# -- no password anywhere ----------------------------------------------------------------

SECRET = "S3cr3t-pw@x"
ENCODED = urllib.parse.quote(SECRET, safe="")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _url(broker: BrokerHandle, port: int | None = None) -> str:
    parts = urllib.parse.urlsplit(broker.url)
    netloc = f"guest:{ENCODED}@{parts.hostname}:{port or parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _assert_no_secret(*texts: str) -> None:
    for t in texts:
        assert SECRET not in t and ENCODED not in t and "S3cr3t" not in t, t[:2000]


@contextlib.contextmanager
def _everything_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """DEBUG for ackkit and the client libraries: what a user's logging could show."""
    with caplog.at_level(logging.DEBUG):
        for name in ("ackkit", "pika", "aiormq", "aio_pika", "asyncio"):
            logging.getLogger(name).setLevel(logging.DEBUG)
        try:
            yield
        finally:
            for name in ("pika", "aiormq", "aio_pika", "asyncio"):
                logging.getLogger(name).setLevel(logging.NOTSET)


@pytest.mark.parametrize("where", ["wrong password", "broker down"])
@pytest.mark.parametrize("runtime", ["sync", "async", "pull", "apull"])
def test_the_password_appears_in_no_log_output_repr_or_error(
    rabbitmq: BrokerHandle,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    runtime: str,
    where: str,
) -> None:
    url = _url(rabbitmq, _closed_port() if where == "broker down" else None)
    reprs: list[str] = []
    raised: BaseException | None = None
    with _everything_logged(caplog):
        try:
            if runtime == "sync":
                app = App(url, startup_timeout=3, reconnect_max_interval=0.5)
                app.listener("pw.never")(lambda d: None)
                reprs += [repr(app), str(app), app.safe_url]
                app.start()
            elif runtime == "async":
                aapp = AsyncApp(url, startup_timeout=3, reconnect_max_interval=0.5)

                @aapp.listener("pw.never")
                async def never(d: Delivery) -> None: ...

                reprs += [repr(aapp), str(aapp)]
                Runner(aapp).start()
            elif runtime == "pull":
                with ackkit.connect(url) as c:
                    reprs.append(repr(c))
            else:

                async def main() -> None:
                    conn = ackkit.pull.AsyncPullConnection(url)
                    reprs.append(repr(conn))
                    async with ackkit.aconnect(url):
                        pass

                asyncio.run(main())
        except Exception as exc:
            raised = exc
    assert raised is not None, "connecting should have failed"
    assert caplog.records  # the clients' own DEBUG logging is in what is checked
    out, err = capsys.readouterr()
    tb = "".join(traceback.format_exception(raised))
    _assert_no_secret(caplog.text, out, err, tb, repr(raised), *reprs)
    assert mask_url(url) in "".join(reprs) or runtime in ("pull", "apull")


# -- body size and content type, both runtimes -------------------------------------------


@pytest.mark.parametrize("runtime", ["sync", "async"])
def test_max_body_size_and_content_type_on_both_runtimes(
    rabbitmq: BrokerHandle, fresh_queue: str, runtime: str
) -> None:
    q, dlq = fresh_queue, f"{fresh_queue}.dlq"
    got: list[str] = []
    app: App | AsyncApp
    kw: dict[str, Any] = {"consumer": Consumer(max_body_size=64)}
    if runtime == "sync":
        app = App(rabbitmq.url)

        @app.listener(q, **kw)
        def handle(body: dict[str, Any], d: Delivery) -> None:
            got.append(d.message_id or "")

    else:
        app = AsyncApp(rabbitmq.url)

        @app.listener(q, **kw)
        async def ahandle(body: dict[str, Any], d: Delivery) -> None:
            got.append(d.message_id or "")

    runner = Runner(app)
    runner.start()
    try:
        publish(rabbitmq.url, q, b'{"pad": "' + b"x" * 64 + b'"}', message_id="big")
        publish(rabbitmq.url, q, b"{}", message_id="text", content_type="text/plain")
        publish(rabbitmq.url, q, b"{}", message_id="xml", content_type="application/xml")
        publish(rabbitmq.url, q, b"{}", message_id="ok")
        publish(rabbitmq.url, q, b"{}", message_id="ok+json", content_type="application/x+json")
        rabbitmq.wait_for(dlq, ready=3, timeout=20)
        rabbitmq.wait_for(q, ready=0, unacked=0, timeout=10)
    finally:
        runner.stop()
    assert sorted(got) == ["ok", "ok+json"]
    dead = drain(rabbitmq.url, dlq)
    reasons = {p.message_id: header_text(p.headers[H.REASON]) for p, _ in dead}
    assert "exceeds max_body_size=64" in reasons["big"]
    assert reasons["text"] == "bad payload: content-type 'text/plain' is not JSON"
    assert reasons["xml"] == "bad payload: content-type 'application/xml' is not JSON"


@pytest.mark.parametrize("runtime", ["sync", "async"])
def test_content_type_check_can_be_turned_off(
    rabbitmq: BrokerHandle, fresh_queue: str, runtime: str
) -> None:
    q = fresh_queue
    got: list[Any] = []
    app: App | AsyncApp
    if runtime == "sync":
        app = App(rabbitmq.url)

        @app.listener(q, consumer=Consumer(check_content_type=False))
        def handle(body: dict[str, Any]) -> None:
            got.append(body)

    else:
        app = AsyncApp(rabbitmq.url)

        @app.listener(q, consumer=Consumer(check_content_type=False))
        async def ahandle(body: dict[str, Any]) -> None:
            got.append(body)

    runner = Runner(app)
    runner.start()
    try:
        publish(rabbitmq.url, q, b'{"a": 1}', message_id="t", content_type="text/plain")
        assert wait_until(lambda: got == [{"a": 1}], timeout=15)
        rabbitmq.wait_for(q, ready=0, unacked=0, timeout=10)
    finally:
        runner.stop()
