"""Several node addresses (`ackkit._connection.addresses`): a list of URLs or the comma form
become single-node URLs in the given order, bad input is refused at once with the
password masked, and the rotation tries the first address first, then the next one
after each failure (wrapping). The apps and pull connections take them through
`Settings` / `addresses.parse`."""

from __future__ import annotations

import urllib.parse
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ackkit
import ackkit.pull
from ackkit import App, AsyncApp
from ackkit._app.launch import Launch
from ackkit._app.settings import Settings
from ackkit._connection import addresses
from ackkit._connection.addresses import Rotation

hosts = st.lists(
    st.tuples(
        st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z0-9]{1,5}){0,2}", fullmatch=True),
        st.none() | st.integers(1, 65535),
    ),
    min_size=1,
    max_size=6,
    unique=True,
)
vhosts = st.sampled_from(["", "/", "/%2f", "/prod", "/a%2Fb"])
queries = st.sampled_from(["", "?heartbeat=5", "?heartbeat=10&connection_attempts=2"])


def netloc(host: str, port: int | None) -> str:
    return host if port is None else f"{host}:{port}"


@given(hosts=hosts, vhost=vhosts, query=queries, scheme=st.sampled_from(["amqp", "amqps"]))
def test_comma_form_is_one_url_per_host_in_order(
    hosts: list[tuple[str, int | None]], vhost: str, query: str, scheme: str
) -> None:
    hostlist = ",".join(netloc(h, p) for h, p in hosts)
    urls = addresses.parse(f"{scheme}://user:pa,ss@{hostlist}{vhost}{query}")
    assert urls == tuple(f"{scheme}://user:pa,ss@{netloc(h, p)}{vhost}{query}" for h, p in hosts)
    for url, (host, port) in zip(urls, hosts, strict=True):
        parts = urllib.parse.urlsplit(url)
        assert (parts.hostname, parts.port) == (host, port)
        assert (parts.username, parts.password) == ("user", "pa,ss")
    # the list form gives the same addresses
    assert addresses.parse(list(urls)) == urls


def test_one_url_is_itself() -> None:
    url = "amqp://guest:guest@127.0.0.1:5672/%2f"
    assert addresses.parse(url) == (url,)
    assert addresses.parse([url]) == (url,)
    assert addresses.parse("memory://x") == ("memory://x",)


def test_the_vhost_is_read_as_pika_reads_it() -> None:
    assert {addresses.vhost(f"amqp://h{p}") for p in ("", "/", "/%2f")} == {"/"}
    assert addresses.vhost("amqp://h/prod") == "prod"
    # so these are alike
    assert len(addresses.parse(["amqp://h1", "amqp://h2/", "amqp://h3/%2f"])) == 3


@pytest.mark.parametrize(
    ("bad", "error", "says"),
    [
        ([], ValueError, "list of node addresses is empty"),
        ((), ValueError, "list of node addresses is empty"),
        (5, TypeError, "must be a str or a list"),
        (b"amqp://h", TypeError, "must be a str or a list"),
        (["amqp://h1", 7], TypeError, "must be a str"),
        ("amqp://u:secret@h1,,h2/v", ValueError, "an empty host"),
        ("amqp://u:secret@h1,/v", ValueError, "an empty host"),
        ("amqp://u:secret@h1,:5672/v", ValueError, "names no host"),
        ("amqp://u:secret@h1,h2:x/v", ValueError, "cannot be parsed"),
        ("amqp://u:secret@h1,h2:99999/v", ValueError, "cannot be parsed"),
        ("http://u:secret@h1,h2/v", ValueError, "amqp:// or amqps://"),
        (["amqp://u:secret@h1/v", "amqp://u:secret@h2/w"], ValueError, "virtual host"),
        (["amqp://u:secret@h1/", "amqp://u:secret@h2/prod"], ValueError, "virtual host"),
        (["amqp://u:secret@h1/v", "amqp://x:secret@h2/v"], ValueError, "same user"),
        (["amqp://u:secret@h1/v", "amqps://u:secret@h2/v"], ValueError, "same scheme"),
        (["amqp://u:secret@h1:1/v", "amqp://u:secret@h1:1/v"], ValueError, "listed twice"),
        ("amqp://u:secret@h1,h1/v", ValueError, "listed twice"),
        (["memory://a", "memory://b"], ValueError, "memory://"),
        ("amqp://u:secret@h1,h2/v?heartbeat=x", ValueError, "heartbeat"),
    ],
)
def test_bad_addresses_are_refused_at_once(bad: object, error: type, says: str) -> None:
    for make in (addresses.parse, Settings.check, App, AsyncApp):
        with pytest.raises(error, match=says) as caught:
            make(bad)
        assert "secret" not in str(caught.value)
    for pull in (ackkit.pull.PullConnection, ackkit.pull.AsyncPullConnection):
        with pytest.raises(error, match=says):
            pull(bad)


def test_rotation_starts_at_the_first_and_wraps() -> None:
    r = Rotation(["a", "b", "c"])
    assert r.current == "a"
    assert [r.advance() for _ in range(5)] == ["b", "c", "a", "b", "c"]
    one = Rotation(["only"])
    assert one.advance() == "only" and one.current == "only"
    with pytest.raises(ValueError):
        Rotation([])


@given(n=st.integers(1, 8), steps=st.integers(0, 30))
def test_rotation_visits_every_address_once_per_round(n: int, steps: int) -> None:
    r = Rotation([f"u{i}" for i in range(n)])
    for _ in range(steps):
        r.advance()
    # from anywhere, n advances visit every address once and come back
    seen = [r.current]
    seen += [r.advance() for _ in range(n - 1)]
    assert sorted(seen) == sorted(r.urls)
    assert r.advance() == seen[0]


def test_apps_keep_every_address_and_mask_them() -> None:
    for cls in (App, AsyncApp):
        app = cls("amqp://u:secret@h1:5672,h2:5673/v", heartbeat=5)
        assert app.urls == ("amqp://u:secret@h1:5672/v", "amqp://u:secret@h2:5673/v")
        assert app.url == app.urls[0]  # the first node, for what takes one URL
        assert app.safe_url == "amqp://u:***@h1:5672/v, amqp://u:***@h2:5673/v"
        assert "secret" not in repr(app)
        app.url = ["amqp://u:secret@h3/v", "amqp://u:secret@h4/v"]
        assert app.urls == ("amqp://u:secret@h3/v", "amqp://u:secret@h4/v")
        app.heartbeat = 7  # another option keeps the addresses
        assert len(app.urls) == 2
        app.url = "amqp://u:secret@h5/v"
        assert app.urls == ("amqp://u:secret@h5/v",) and app.safe_url == "amqp://u:***@h5/v"


def test_tls_server_name_follows_the_node() -> None:
    s = Settings.check(["amqps://h1.example/v", "amqps://h2.example/v"])
    assert s.tls is not None
    first, second = s.tls_for(s.urls[0]), s.tls_for(s.urls[1])
    assert first is not None and second is not None
    assert first[1] == "h1.example" and second == (s.tls[0], "h2.example")
    named = Settings.check(
        ["amqps://h1/v", "amqps://h2/v"], tls=ackkit.TLS(server_hostname="rabbit.example")
    )
    assert named.tls_for(named.urls[1])[1] == "rabbit.example"  # type: ignore[index]


def test_pull_connections_keep_every_address_and_mask_them() -> None:
    conn = ackkit.pull.AsyncPullConnection("amqp://u:secret@h1:5672,h2:5673/v")  # not opened
    assert conn.urls == ("amqp://u:secret@h1:5672/v", "amqp://u:secret@h2:5673/v")
    assert conn.url == conn.urls[0]
    assert repr(conn) == "<AsyncPullConnection amqp://u:***@h1:5672/v, amqp://u:***@h2:5673/v>"


def test_the_sync_engine_tries_the_addresses_in_order() -> None:
    """Each failed attempt moves the engine to the next address, wrapping."""
    import threading

    from ackkit._connection.io import ConnectFailed
    from ackkit._sync.engine import Engine

    urls = ["amqp://u:secret@h1/v", "amqp://u:secret@h2/v", "amqp://u:secret@h3/v"]
    tried: list[str] = []
    done = threading.Event()

    class Probe(Engine):
        def parameters(self) -> Any:
            tried.append(self.url)
            assert "secret" not in self.safe_url
            if len(tried) == 7:
                self.request_stop()
            raise ConnectFailed("nobody home")

        def finished(self) -> None:
            done.set()

    engine = Probe(urls[0], "masked", 0.001, urls)
    engine.start_io("probe")
    assert done.wait(30)
    assert tried == [*urls, *urls, urls[0]]


def test_the_async_runtime_tries_the_addresses_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same order on AsyncApp's runtime (its connection attempts are stubbed)."""
    import asyncio

    from ackkit._async import runtime as rt_module
    from ackkit._connection.io import ConnectFailed

    urls = ["amqp://u:secret@h1/v", "amqp://u:secret@h2/v", "amqp://u:secret@h3/v"]
    tried: list[str] = []

    async def main() -> None:
        runtime = rt_module.AsyncRuntime(
            Launch(Settings.check(urls, reconnect_max_interval=0.001), specs=[])
        )

        async def open_connection(url: str, **kw: Any) -> Any:
            tried.append(url)
            assert "secret" not in runtime.safe_url
            if len(tried) == 7:
                runtime.stopping = True
            raise ConnectFailed("nobody home")

        monkeypatch.setattr(rt_module, "open_connection", open_connection)
        await asyncio.wait_for(runtime._run_forever(), 30)

    asyncio.run(main())
    assert tried == [*urls, *urls, urls[0]]
