"""The test kit's RabbitMQ 4.x nodes: a Debian root with the broker, and
throwaway nodes run inside it beside the machine's own RabbitMQ.

What the broker shows is asserted: the version it announces, counts right
after a publish (quorum queues too), confirmed messages surviving restart and
SIGKILL, listeners on 127.0.0.1 only, nothing left running or mounted after
close. These tests use a 4.3 node whatever ``ACKKIT_TEST_RABBITMQ`` says; they
need root (chroot) and, on the first run, debootstrap and Debian's mirror.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from ackkit.testing import BrokerHandle, QueueCounts, provision_broker
from ackkit.testing import _env as env_mod
from ackkit.testing._util import pid_alive
from ackkit.testing.plugin import QueueFactory, _version_skip_reason
from ackkit_testkit import _rootfs as rootfs_mod
from ackkit_testkit._proc import iter_processes
from ackkit_testkit._provider_chroot import _ChrootNode

pytestmark = pytest.mark.integration

PERSISTENT = pika.BasicProperties(delivery_mode=2)
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="a node in a Debian root needs root (debootstrap, chroot)"
)


@pytest.fixture(scope="module")
def node43() -> Iterator[BrokerHandle]:
    if os.geteuid() != 0:
        pytest.skip("a RabbitMQ 4.3 node in a Debian root needs root (debootstrap, chroot)")
    with provision_broker("own", exclusive=True, rabbitmq="4.3") as broker:
        yield broker


@pytest.fixture
def n43(node43: BrokerHandle) -> BrokerHandle:
    node43.start()  # running at the start of every test
    return node43


@contextlib.contextmanager
def channel(broker: BrokerHandle) -> Iterator[Any]:
    conn = broker.connect()
    try:
        yield conn.channel()
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def declare_and_publish(broker: BrokerHandle, queue: str, kind: str, n: int) -> None:
    with channel(broker) as ch:
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": kind})
        ch.confirm_delivery()
        for i in range(n):
            ch.basic_publish("", queue, b"m%d" % i, properties=PERSISTENT, mandatory=True)


def listening_addresses(port: int) -> set[str]:
    """Local addresses with a TCP socket listening on ``port`` (from /proc/net/tcp*)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table, encoding="ascii") as fh:
            next(fh)
            for line in fh:
                local, state = line.split()[1], line.split()[3]
                addr, hexport = local.rsplit(":", 1)
                if state == "0A" and int(hexport, 16) == port:
                    found.add(addr)
    return found


# --------------------------------------------------------------------------- the node


@needs_root
def test_the_node_is_rabbitmq_4_3(n43: BrokerHandle) -> None:
    assert n43.own and n43.kind == "own"
    assert n43.server_version().startswith("4.3.")
    assert "RabbitMQ version: 4.3." in n43.ctl("status")
    assert str(n43.node_name) in n43.ctl("eval", "node().")
    assert "rabbitmq=4.3." in repr(n43)


@needs_root
@pytest.mark.parametrize("kind", ["classic", "quorum"])
def test_counts_are_exact_right_after_publish(
    n43: BrokerHandle, queue_factory: QueueFactory, kind: str
) -> None:
    # A quorum queue's own statistics lag by up to ~5 s; the kit asks its Raft state.
    q = queue_factory(kind, broker=n43)
    declare_and_publish(n43, q, kind, 3)
    assert n43.counts(q) == QueueCounts(ready=3, unacked=0, total=3, consumers=0)
    assert n43.counts_all()[q] == QueueCounts(3, 0, 3, 0)
    conn = n43.connect()
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1)
        tags: list[int] = []
        ch.basic_consume(q, lambda _c, m, _p, _b: tags.append(m.delivery_tag))
        deadline = time.monotonic() + 10
        while not tags and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        assert tags
        assert n43.counts(q) == QueueCounts(ready=2, unacked=1, total=3, consumers=1)
    finally:
        conn.close()
    n43.wait_for(q, ready=3, unacked=0, consumers=0)


@needs_root
def test_ctl_counts_agree_with_fast_counts(n43: BrokerHandle, queue_factory: QueueFactory) -> None:
    q = queue_factory(broker=n43)
    declare_and_publish(n43, q, "classic", 2)
    assert n43._ctl_counts()[q] == n43.counts(q) == QueueCounts(2, 0, 2, 0)


@needs_root
def test_restart_and_kill_keep_confirmed_messages(
    n43: BrokerHandle, queue_factory: QueueFactory
) -> None:
    qq, cq = queue_factory("qq", broker=n43), queue_factory("cq", broker=n43)
    declare_and_publish(n43, qq, "quorum", 2)
    declare_and_publish(n43, cq, "classic", 2)
    n43.restart()
    assert n43.counts(qq) == n43.counts(cq) == QueueCounts(2, 0, 2, 0)
    n43.kill()
    assert not n43.ping(timeout=1)
    assert not n43.is_running()
    n43.start()
    n43.wait_for(qq, ready=2, total=2, timeout=30)
    assert n43.counts(cq) == QueueCounts(2, 0, 2, 0)


@needs_root
def test_stop_then_the_next_test_gets_it_running(n43: BrokerHandle) -> None:
    n43.stop()
    assert not n43.ping(timeout=1)


@needs_root
def test_running_again(n43: BrokerHandle) -> None:
    assert n43.ping()


@needs_root
def test_listens_on_loopback_only(n43: BrokerHandle) -> None:
    node: Any = n43
    ports = {"amqp": n43.amqp_port, "dist": node._dist_port, "epmd": node._epmd_port}
    # 127.0.0.1, ::ffff:127.0.0.1 and ::1 as /proc/net/tcp{,6} spell them
    loopback = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}
    for what, port in ports.items():
        addrs = listening_addresses(port)
        assert addrs, f"nothing listens on the {what} port {port}"
        assert addrs <= loopback, f"{what} port {port} listens on {addrs}"
    assert 5672 not in ports.values() and 4369 not in ports.values()


@needs_root
def test_close_leaves_nothing_behind() -> None:
    broker = provision_broker("own", exclusive=True, rabbitmq="4.3")
    node: Any = broker
    base, epmd, port = node._base, node._epmd, node._epmd_port
    beams = node._beam_pids()
    assert beams and epmd is not None
    broker.close()
    assert not os.path.exists(base)
    assert not any(pid_alive(pid) for pid in beams)
    assert epmd.poll() is not None
    assert not listening_addresses(port)
    root = os.path.realpath(node._root)
    assert not [pid for pid, cmd in iter_processes() if base in cmd]
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        assert not [line for line in fh if f" {root}/" in line]


# --------------------------------------------------------------------------- the root


@needs_root
def test_the_root_is_cached_and_holds_the_version(node43: BrokerHandle) -> None:
    started = time.monotonic()
    root = rootfs_mod.ensure_root("4.3")
    assert time.monotonic() - started < 2  # cached: no second build
    assert str(rootfs_mod.root_version(root)).startswith("4.3.")
    assert (root / rootfs_mod.MARKER).is_file()
    assert not str(root).startswith(str(pathlib.Path(__file__).parents[2]))  # not in the repo


def test_unknown_version_is_refused_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"known: 4\.0, 4\.3"):
        rootfs_mod.ensure_root("3.9")
    monkeypatch.setenv("ACKKIT_TEST_RABBITMQ", "5.1")
    monkeypatch.delenv("AMQP_URL", raising=False)
    with pytest.raises(ValueError, match=r"ACKKIT_TEST_RABBITMQ='5.1'.*3.10, 4.0, 4.3"):
        provision_broker("own")


def test_version_names() -> None:
    assert env_mod.wanted_version("4.3") == env_mod.wanted_version("4") == "4.3"
    assert env_mod.wanted_version("3.10") == env_mod.wanted_version("system") == "3.10"
    assert env_mod.wanted_version(" 4.0 ") == "4.0"


def test_without_root_the_error_names_the_alternatives(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    monkeypatch.setenv("ACKKIT_ROOTFS_DIR", str(tmp_path))
    monkeypatch.setattr(rootfs_mod.os, "geteuid", lambda: 1000)
    with pytest.raises(rootfs_mod.RootfsUnavailable) as info:
        rootfs_mod.ensure_root("4.3")
    text = str(info.value)
    assert "needs root" in text and "AMQP_URL" in text and "Docker" in text
    assert not list(tmp_path.iterdir())  # nothing half made


@needs_root
def test_without_debootstrap_the_error_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    monkeypatch.setenv("ACKKIT_ROOTFS_DIR", str(tmp_path))
    monkeypatch.setattr(rootfs_mod.shutil, "which", lambda *_a, **_k: None)
    with pytest.raises(rootfs_mod.RootfsUnavailable, match="apt-get install -y debootstrap"):
        rootfs_mod.ensure_root("4.0")


@needs_root
def test_unreachable_mirror_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    with socket.socket() as sock:  # a local port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("ACKKIT_ROOTFS_DIR", str(tmp_path))
    monkeypatch.setenv("ACKKIT_DEBIAN_MIRROR", f"http://127.0.0.1:{port}/debian")
    with pytest.raises(rootfs_mod.RootfsUnavailable, match="does not answer") as info:
        rootfs_mod.ensure_root("4.0")
    assert "ACKKIT_DEBIAN_MIRROR" in str(info.value) and "AMQP_URL" in str(info.value)
    assert not (tmp_path / "rabbitmq-4.0").exists()


@needs_root
def test_leftovers_of_a_killed_build_are_removed_without_crossing_mounts(
    tmp_path: pathlib.Path,
) -> None:
    # A killed build can leave a temporary root, possibly with something mounted in it.
    stale = tmp_path / ".building-rabbitmq-4.3-1-abcdef"
    (stale / "proc").mkdir(parents=True)
    (stale / "etc").mkdir()
    (stale / "etc/hosts").write_text("x")
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(stale / "proc")], check=True)
    (stale / "proc/inside").write_text("on the mount")
    other = tmp_path / ".building-rabbitmq-4.0-1-abcdef"  # another version's build: kept
    other.mkdir()
    rootfs_mod._remove_leftovers(tmp_path, "4.3")
    assert not stale.exists()
    assert other.exists()
    assert not rootfs_mod._mounts_under(tmp_path)


def test_a_usable_root_is_returned_without_root_or_debootstrap(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    # (A Docker image build may read a root that was built before, as any user.)
    root = tmp_path / "rabbitmq-4.3"
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(
        "Package: rabbitmq-server\nStatus: install ok installed\nVersion: 4.3.6-1\n\n"
        "Package: erlang-base\nStatus: install ok installed\nVersion: 1:29.0\n"
    )
    (root / rootfs_mod.MARKER).write_text("{}")
    monkeypatch.setenv("ACKKIT_ROOTFS_DIR", str(tmp_path))
    monkeypatch.setattr(rootfs_mod.os, "geteuid", lambda: 1000)
    assert rootfs_mod.ensure_root("4.3") == root
    (root / "var/lib/dpkg/status").write_text(
        "Package: rabbitmq-server\nStatus: install ok installed\nVersion: 4.2.1-1\n"
    )
    with pytest.raises(rootfs_mod.RootfsUnavailable):  # wrong version: rebuilt (needs root)
        rootfs_mod.ensure_root("4.3")


# --------------------------------------------------------------------------- selection


@needs_root
def test_the_environment_picks_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    # 4.3, whose root make test's 4.3 legs build anyway: a 4.0 root is a minute or two of
    # debootstrap for this one test (make test-matrix runs every suite on a 4.0 node)
    monkeypatch.delenv("AMQP_URL", raising=False)
    monkeypatch.setenv("ACKKIT_TEST_BROKER", "own")
    monkeypatch.setenv("ACKKIT_TEST_RABBITMQ", "4.3")
    with provision_broker() as broker:
        assert isinstance(broker, _ChrootNode)
        assert broker.server_version().startswith("4.3.")


def test_amqp_url_wins_over_the_version(
    monkeypatch: pytest.MonkeyPatch, rabbitmq: BrokerHandle
) -> None:
    monkeypatch.setenv("AMQP_URL", rabbitmq.url)
    monkeypatch.delenv("ACKKIT_TEST_BROKER", raising=False)
    monkeypatch.setenv("ACKKIT_TEST_RABBITMQ", "4.3")
    with provision_broker() as broker:
        assert broker.kind == "url"
        assert broker.server_version() == rabbitmq.server_version()


def test_version_marker_reasons() -> None:
    mark = pytest.mark.rabbitmq
    assert _version_skip_reason(mark(min="4.0").mark, "4.3.6") is None
    assert "4.0 or newer" in str(_version_skip_reason(mark(min="4.0").mark, "3.10.8"))
    assert "3.13 or older" in str(_version_skip_reason(mark(max="3.13").mark, "4.0.5"))
    assert _version_skip_reason(mark("4.3", "4.0").mark, "4.0.5") is None
    assert "needs RabbitMQ 4.3" in str(_version_skip_reason(mark("4.3").mark, "3.10.8"))
    assert _version_skip_reason(mark("3.10").mark, "3.10.8") is None


def _run_pytest(tmp_path: pathlib.Path, source: str, *args: str, url: str) -> Any:
    (tmp_path / "test_it.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACKKIT_TEST_")}
    env.update(AMQP_URL=url, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "ackkit.testing.plugin", "-rs", "-q",
         "-p", "no:cacheprovider", str(tmp_path / "test_it.py"), *args],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, check=False,
    )  # fmt: skip


def test_the_rabbitmq_option_and_marker(tmp_path: pathlib.Path, rabbitmq: BrokerHandle) -> None:
    source = (
        "import os, pytest\n"
        "def test_env():\n"
        "    assert os.environ['ACKKIT_TEST_RABBITMQ'] == '4.0'\n"
        "@pytest.mark.rabbitmq(min='99.0')\n"
        "def test_future(rabbitmq):\n"
        "    raise AssertionError('must be skipped')\n"
        "def test_version(rabbitmq_version, rabbitmq):\n"
        "    assert rabbitmq_version == rabbitmq.server_version()\n"
        "    assert rabbitmq_version[0].isdigit()\n"
    )
    res = _run_pytest(tmp_path, source, "--rabbitmq=4.0", url=rabbitmq.url)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 passed, 1 skipped" in res.stdout
    assert "needs RabbitMQ 99.0 or newer; the broker is" in res.stdout
    bad = _run_pytest(tmp_path, source, "--rabbitmq=5.1", url=rabbitmq.url)
    assert bad.returncode == 4  # usage error
    assert "--rabbitmq" in bad.stderr and "3.10, 4.0, 4.3" in bad.stderr


FAKE_DEBOOTSTRAP = """#!/bin/sh
# debootstrap stand-in: $4 is the target; counts its runs, then makes a "root".
mkdir -p "$4"
echo run >> "$COUNTER"
sleep "$SLEEP"
mkdir -p "$4/var/lib/dpkg" "$4/etc" "$4/var/cache/apt/archives"
printf 'Package: rabbitmq-server\\nStatus: install ok installed\\nVersion: 4.3.9-1\\n' \\
    > "$4/var/lib/dpkg/status"
"""


@pytest.fixture
def fake_build(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> pathlib.Path:
    """ensure_root builds with a stand-in for debootstrap into a cache under tmp_path."""
    script = tmp_path / "debootstrap"
    script.write_text(FAKE_DEBOOTSTRAP)
    script.chmod(0o755)
    cache = tmp_path / "cache"
    monkeypatch.setenv("ACKKIT_ROOTFS_DIR", str(cache))
    monkeypatch.setenv("COUNTER", str(tmp_path / "runs"))
    monkeypatch.setenv("SLEEP", "1")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(rootfs_mod, "_check_mirror", lambda *_a: None)
    return cache


def _runs(cache: pathlib.Path) -> int:
    path = cache.parent / "runs"
    return len(path.read_text().split()) if path.exists() else 0


@needs_root
def test_concurrent_callers_build_the_root_once(fake_build: pathlib.Path) -> None:
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        roots = list(pool.map(lambda _: rootfs_mod.ensure_root("4.3"), range(3)))
    assert roots == [fake_build / "rabbitmq-4.3"] * 3
    assert _runs(fake_build) == 1
    assert rootfs_mod.root_version(roots[0]) == "4.3.9-1"
    assert (roots[0] / "etc/hosts").read_text().startswith("127.0.0.1")
    assert [p.name for p in fake_build.iterdir() if p.name.startswith(".building")] == []


@needs_root
def test_a_killed_build_leaves_no_root_and_the_next_one_builds_it(
    fake_build: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLEEP", "60")
    code = (
        "import ackkit_testkit._rootfs as r; r._check_mirror = lambda *a: None; "
        "r.ensure_root('4.3')"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    while _runs(fake_build) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _runs(fake_build) == 1, "the build did not start"
    proc.kill()  # SIGKILL in the middle of debootstrap
    proc.wait()
    assert not (fake_build / "rabbitmq-4.3").exists()
    (half,) = [p for p in fake_build.iterdir() if p.name.startswith(".building-rabbitmq-4.3")]

    def stand_ins() -> list[str]:
        # looked up anew each time: a child the stand-in forks shows the stand-in's
        # command line until it execs (here `sleep`, whose line names no build), and a
        # busy machine widens that window
        return [cmd for pid, cmd in iter_processes() if str(half) in cmd and pid_alive(pid)]

    deadline = time.monotonic() + 30
    while stand_ins() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not stand_ins(), f"debootstrap outlived its caller: {stand_ins()}"
    monkeypatch.setenv("SLEEP", "0")
    root = rootfs_mod.ensure_root("4.3")
    assert rootfs_mod.root_version(root) == "4.3.9-1"
    assert not half.exists()
    assert _runs(fake_build) == 2
