"""A throwaway RabbitMQ cluster of the kit's own: three nodes (by default) on this
machine, sharing an Erlang cookie, joined with ``join_cluster``.

Each node is a node of the kit's own (:mod:`._provider_node` for the machine's
``rabbitmq-server``, 3.10; :mod:`._provider_chroot` for 4.x in a Debian root):
its own data directory, node name, AMQP and distribution ports. The nodes boot in
parallel, then the second and later ones join the first. In a Debian root the
nodes share one epmd (an Erlang node finds its peers through the epmd of their
host, and here every node's host is ``localhost``); the machine's nodes use the
machine's epmd, as a single node of the kit's own does.

The cluster's handle controls its nodes one by one (SIGKILL, clean stop, start,
freeze with SIGSTOP past the net tick time and thaw with SIGCONT) and reads what
the nodes themselves report (``rabbitmqctl cluster_status``, a quorum queue's
leader and members). Closing it kills every node and removes its data; so does
the end of the process (the kit's registry, and each node's watchdog when the
process is SIGKILLed).

The nodes run ``cluster_partition_handling = autoheal`` (once nodes that lost each
other meet again, the side with fewer nodes restarts and rejoins; ``pause_minority``
and ``ignore`` on request) and a short ``net_ticktime`` (6 s unless asked otherwise),
so that a frozen node is seen as gone in seconds, not a minute.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from ackkit.testing import BrokerError, BrokerUnavailable
from ackkit.testing.providers import (
    DEFAULT_VERSION,
    HOW_TO_GET_A_BROKER,
    free_port,
    wanted_version,
)

from ._node_os import _find_rabbitmq_server
from ._proc import kill_pid
from ._provider_node import _OwnNode

__all__ = ["ClusterHandle", "QuorumStatus", "own_cluster"]

log = logging.getLogger("ackkit.testing")

DEFAULT_NET_TICKTIME = 6
# autoheal, not pause_minority (RabbitMQ's advice for three nodes in production): a
# frozen node that thaws gets its nodedowns one by one while it reconnects, and
# pause_minority's count of the nodes it still sees can then say "majority" (seen here
# on 3.10: the thawed node ran on, the others listed it as partitioned, for minutes).
# autoheal acts on the partition once the nodes see each other again: the side with
# fewer nodes restarts and rejoins, in seconds.
DEFAULT_PARTITION_HANDLING = "autoheal"
PARTITION_HANDLING = ("autoheal", "pause_minority", "ignore")
# A node autoheal restarts waits for the winner's "safe to start" this long before it
# tries again (RabbitMQ's default 60 s; 3.10 here missed the message about every other
# heal and sat out the whole minute).
_ADVANCED_CONFIG = "[{rabbit, [{autoheal_state_transition_timeout, 5000}]}].\n"

# What cluster_status reports as running nodes (4.x: rabbit_nodes:list_running/0; 3.10:
# rabbit_mnesia's running nodes, which all_running/0 gives) and the partitions a node
# saw ("OK;<node>,<node>;<node>,...").
_RUNNING_EXPR = (
    "R = try rabbit_nodes:list_running() catch error:undef -> rabbit_nodes:all_running() end, "
    "P = try rabbit_node_monitor:partitions() catch _:_ -> [] end, "
    'J = fun(L) -> lists:join(",", [atom_to_list(N) || N <- L]) end, '
    'lists:flatten(["OK;", J(R), ";", J(P)]).'
)


def _erl_binary(text: str) -> str:
    """An Erlang binary literal for ``text`` that needs no escaping: <<104,105>>."""
    return "<<" + ",".join(str(b) for b in text.encode("utf-8")) + ">>"


def _quorum_expr(vhost: str, queue: str) -> str:
    """What ``list_queues name type leader members online`` reports of one queue, asked
    of the node itself (the same ``rabbit_quorum_queue:info/2``): answers
    "OK;quorum;<leader>;<member>,...;<online member>,...", "OK;type;<module>" for
    another kind of queue, or "OK;missing"."""
    return (
        f"R = rabbit_misc:r({_erl_binary(vhost)}, queue, {_erl_binary(queue)}), "
        'N = fun(X) when is_atom(X) -> atom_to_list(X); (_) -> "" end, '
        'J = fun(L) when is_list(L) -> lists:join(",", [N(X) || X <- L]); (_) -> "" end, '
        "A = case rabbit_amqqueue:lookup(R) of {ok, Q} -> case amqqueue:get_type(Q) of "
        "rabbit_quorum_queue -> I = rabbit_quorum_queue:info(Q, [leader, members, online]), "
        '["quorum;", N(proplists:get_value(leader, I)), ";", '
        'J(proplists:get_value(members, I)), ";", J(proplists:get_value(online, I))]; '
        'T -> ["type;", atom_to_list(T)] end; _ -> "missing" end, '
        'lists:flatten(["OK;", A]).'
    )


_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class QuorumStatus:
    """A quorum queue as the cluster reports it: its leader and its members
    (node names; ``online``: the members whose replica runs)."""

    leader: str
    members: tuple[str, ...]
    online: tuple[str, ...]


class ClusterHandle:
    """A throwaway RabbitMQ cluster of the kit's own; :func:`own_cluster` makes one.

    ``nodes`` are the nodes' own handles (:class:`~ackkit.testing.BrokerHandle`:
    ``url``, ``node_name``, ``amqp_port``, ``counts()``, ``ctl()``, ...), in the order
    they were started; the first is the one the others joined. Node control takes a
    node's index in ``nodes`` (0, 1, 2).
    """

    def __init__(
        self,
        nodes: Sequence[_OwnNode],
        *,
        version: str,
        net_ticktime: int,
        epmd_port: int | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.nodes: list[_OwnNode] = list(nodes)
        self.epmd_port = epmd_port
        """The epmd the nodes share (4.x in a Debian root; ``ERL_EPMD_PORT`` for a
        rabbitmqctl run in that root), None for the machine's own epmd (3.10)."""
        self.version = version
        self.net_ticktime = net_ticktime
        self.start_seconds: float | None = None
        self._on_close = on_close
        self._frozen: set[int] = set()
        self._lock = threading.RLock()
        self._closed = False

    # -- identity ---------------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        """The AMQP URL of each node (``amqp://guest:guest@127.0.0.1:<port>/%2f``)."""
        return [node.url for node in self.nodes]

    def url(self, index: int) -> str:
        return self.nodes[index].url

    @property
    def node_names(self) -> list[str]:
        return [str(node.node_name) for node in self.nodes]

    def index_of(self, node_name: str) -> int:
        """The index of the node called ``node_name`` (as the broker names it)."""
        return self.node_names.index(node_name)

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, index: int) -> _OwnNode:
        return self.nodes[index]

    def __repr__(self) -> str:
        names = ", ".join(self.node_names)
        return f"<ClusterHandle rabbitmq={self.version} nodes=[{names}]>"

    # -- node control -------------------------------------------------------------------

    def kill(self, index: int) -> None:
        """SIGKILL node ``index``'s Erlang VM (no clean shutdown, nothing flushed);
        ``start(index)`` brings it back into the cluster."""
        with self._lock:
            self._thaw_if_frozen(index)
            self.nodes[index].kill(flush_metadata=False)

    def stop(self, index: int) -> None:
        """Clean shutdown of node ``index`` (its data stays for ``start``)."""
        with self._lock:
            self._thaw_if_frozen(index)
            self.nodes[index].stop()

    def start(self, *indexes: int) -> None:
        """Boot the given nodes again (default: every node not running), in parallel;
        returns once each answers AMQP. A node rejoins the cluster by itself (its data
        says where it belongs); :meth:`wait_running` waits for the cluster to see it."""
        with self._lock:
            wanted = indexes or tuple(range(len(self.nodes)))
            for index in wanted:
                self._thaw_if_frozen(index)
            todo = [i for i in wanted if not self.nodes[i].is_running()]
            _in_parallel([self.nodes[i].start for i in todo])

    def restart(self, index: int) -> None:
        self.stop(index)
        self.start(index)

    def suspend(self, index: int) -> None:
        """SIGSTOP node ``index``'s Erlang VM: it holds its sockets but answers nothing
        (a frozen VM, a machine paused in a hypervisor). :meth:`resume` undoes it."""
        with self._lock:
            pids = self.nodes[index]._beam_pids()
            if not pids:
                raise BrokerError(f"node {index} ({self.node_names[index]}) is not running")
            for pid in pids:
                kill_pid(pid, signal.SIGSTOP)
            self._frozen.add(index)

    def resume(self, index: int) -> None:
        """SIGCONT node ``index``'s Erlang VM (after :meth:`suspend`)."""
        with self._lock:
            for pid in self.nodes[index]._beam_pids():
                kill_pid(pid, signal.SIGCONT)
            self._frozen.discard(index)

    def freeze(self, index: int, seconds: float | None = None) -> float:
        """Suspend node ``index`` for ``seconds`` (default: past the net tick time, so
        that the other nodes see it as gone), then resume it; returns the seconds it was
        frozen. The cluster's answer (a paused minority that comes back) takes a few
        seconds more: :meth:`wait_running`."""
        if seconds is None:
            seconds = self.net_ticktime * 1.25 + 2.0
        with self.frozen(index):
            started = time.monotonic()
            time.sleep(seconds)
        return time.monotonic() - started

    @contextlib.contextmanager
    def frozen(self, index: int) -> Iterator[None]:
        """Node ``index`` suspended (SIGSTOP) for the with-block, resumed after it."""
        self.suspend(index)
        try:
            yield
        finally:
            self.resume(index)

    def _thaw_if_frozen(self, index: int) -> None:
        if index in self._frozen:
            self.resume(index)

    def is_running(self, index: int) -> bool:
        return self.nodes[index].is_running()

    # -- what the nodes report ------------------------------------------------------------

    def _via(self, via: int | None) -> _OwnNode:
        if via is not None:
            return self.nodes[via]
        for index, node in enumerate(self.nodes):
            if index not in self._frozen and node.is_running():
                return node
        raise BrokerError(f"no node of {self!r} is running")

    def cluster_status(self, via: int | None = None, *, timeout: float = 120.0) -> dict[str, Any]:
        """``rabbitmqctl cluster_status --formatter json`` as node ``via`` (default: the
        first running node) reports it: ``running_nodes``, ``disk_nodes``,
        ``partitions``, ``alarms``, ..."""
        text = self._via(via).ctl("cluster_status", "--formatter", "json", timeout=timeout)
        data: dict[str, Any] = json.loads(text)
        return data

    def running_nodes(self, via: int | None = None) -> list[str]:
        """The nodes node ``via`` (default: the first running one) reports running (the
        ``running_nodes`` of its ``cluster_status``), sorted."""
        return self._report(self._via(via))[0]

    def _report(self, node: _OwnNode) -> tuple[list[str], list[str]]:
        """(running nodes, partitions) as ``node`` reports them: asked through erl_call
        (milliseconds; the functions ``cluster_status`` calls), else through
        ``rabbitmqctl cluster_status`` (a second or two)."""
        out = node._erl_eval(_RUNNING_EXPR)
        if out is not None and out.count(";") == 1:
            running, partitions = (sorted(filter(None, p.split(","))) for p in out.split(";"))
            return running, partitions
        status: dict[str, Any] = json.loads(
            node.ctl("cluster_status", "--formatter", "json", timeout=60)
        )
        return sorted(status.get("running_nodes") or []), sorted(status.get("partitions") or [])

    def wait_running(
        self,
        count: int | None = None,
        *,
        timeout: float = 90.0,
        interval: float = 0.5,
    ) -> list[str]:
        """Wait until every running node (not frozen) reports the same ``count`` running
        nodes (default: all of them) and answers AMQP; returns their names. AssertionError
        with the last report on timeout. A partition a node still records is shown in
        that report but not waited for: 3.10 can keep one after the nodes healed and run
        together again (:meth:`partitions`)."""
        want = len(self.nodes) if count is None else count
        deadline = time.monotonic() + timeout
        last: object = "no answer yet"
        while True:
            try:
                views = self._views()
                lists = [
                    v if isinstance(v, list) else None
                    for k, v in views.items()
                    if not k.endswith(" partitioned from")
                ]
                if (
                    views
                    and all(r is not None and len(r) == want for r in lists)
                    and len({tuple(r or ()) for r in lists}) == 1
                ):
                    return lists[0] or []
                last = views
            except BrokerError as exc:
                last = str(exc).splitlines()[0]
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"the cluster did not report {want} running nodes within {timeout:.0f}s; "
                    f"last: {last}"
                )
            time.sleep(interval)

    def _views(self) -> dict[str, object]:
        """What each running node (not frozen) reports, asked in parallel: its running
        nodes, or (running nodes, partitions) when it reports a partition."""
        asked = [
            i for i, node in enumerate(self.nodes) if i not in self._frozen and node.is_running()
        ]
        answers = _in_parallel([functools.partial(self._report, self.nodes[i]) for i in asked])
        views: dict[str, object] = {}
        for index, (running, partitions) in zip(asked, answers, strict=True):
            views[self.node_names[index]] = running
            if partitions:
                views[f"{self.node_names[index]} partitioned from"] = partitions
        if all(isinstance(view, list) for view in views.values()):
            # a node restarting (autoheal) reports its peers before it listens for AMQP
            pings = _in_parallel([functools.partial(self.nodes[i].ping, 5.0) for i in asked])
            for index, answers_amqp in zip(asked, pings, strict=True):
                if not answers_amqp:
                    views[self.node_names[index]] = "running, not answering AMQP yet"
        return views

    def partitions(self) -> dict[str, list[str]]:
        """The partitions the running nodes (not frozen) record: node -> the nodes it was
        cut off from (``cluster_status``'s ``partitions``); {} when none records one."""
        asked = [
            i for i, node in enumerate(self.nodes) if i not in self._frozen and node.is_running()
        ]
        answers = _in_parallel([functools.partial(self._report, self.nodes[i]) for i in asked])
        return {
            self.node_names[i]: partitions
            for i, (_running, partitions) in zip(asked, answers, strict=True)
            if partitions
        }

    def quorum_status(
        self, queue: str, *, via: int | None = None, vhost: str = "/"
    ) -> QuorumStatus:
        """Leader and members of quorum queue ``queue``, as node ``via`` reports them
        (``rabbitmqctl list_queues name leader members online``). BrokerError when the
        report has no such queue, which is also what a node says of a queue whose leader
        it cannot reach (just after a kill or freeze): :meth:`wait_leader` waits that out.
        Asked through erl_call (the node's own answer, in milliseconds); rabbitmqctl when
        that does not answer. Through erl_call the node reports the leader it last knew
        until a new one is elected, so wait with ``not_on`` for a leader to move."""
        node = self._via(via)
        out = node._erl_eval(_quorum_expr(vhost, queue))
        if out is not None:
            kind, _, rest = out.partition(";")
            if kind == "quorum":
                leader, members, online = [*rest.split(";"), "", ""][:3]
                return QuorumStatus(
                    leader=leader,
                    members=tuple(sorted(filter(None, members.split(",")))),
                    online=tuple(sorted(filter(None, online.split(",")))),
                )
            if kind == "type":
                queue_type = rest.removeprefix("rabbit_").removesuffix("_queue")
                raise BrokerError(f"queue {queue!r} is a {queue_type} queue")
            if kind == "missing":
                raise BrokerError(f"queue {queue!r} does not exist (vhost {vhost!r})")
            log.debug("fast quorum_status output not understood: %r", out[:300])
        text = node.ctl(
            "list_queues", "-p", vhost, "--formatter", "json", "--quiet",
            "name", "type", "leader", "members", "online",
        )  # fmt: skip
        for row in json.loads(text or "[]"):
            if row.get("name") == queue:
                if row.get("type") != "quorum":
                    raise BrokerError(f"queue {queue!r} is a {row.get('type')} queue")
                return QuorumStatus(
                    leader=str(row.get("leader") or ""),
                    members=tuple(sorted(row.get("members") or [])),
                    online=tuple(sorted(row.get("online") or [])),
                )
        raise BrokerError(f"queue {queue!r} does not exist (vhost {vhost!r})")

    def wait_leader(
        self,
        queue: str,
        *,
        not_on: str | None = None,
        via: int | None = None,
        vhost: str = "/",
        timeout: float = 60.0,
    ) -> str:
        """The leader of quorum queue ``queue`` once node ``via`` reports one (other than
        ``not_on``, e.g. the node just killed or frozen). While the queue has no leader it
        can reach, a node leaves the queue out of its report: that counts as "not yet"."""
        deadline = time.monotonic() + timeout
        last: object = "no answer yet"
        while True:
            try:
                status = self.quorum_status(queue, via=via, vhost=vhost)
                if status.leader and status.leader != not_on:
                    return status.leader
                last = status
            except BrokerError as exc:
                last = str(exc).splitlines()[0]
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"quorum queue {queue!r} had no leader"
                    + (f" other than {not_on}" if not_on else "")
                    + f" within {timeout:.0f}s; last: {last}"
                )
            time.sleep(0.2)

    # -- lifetime -------------------------------------------------------------------------

    def __enter__(self) -> ClusterHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Kill every node and remove its data (nothing is left running)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                _in_parallel([node.close for node in self.nodes])
            finally:
                self._frozen.clear()
                if self._on_close is not None:
                    self._on_close()


def _in_parallel(calls: Sequence[Callable[[], _T]]) -> list[_T]:
    """Run ``calls`` in threads; the first failure is raised once all have ended."""
    if len(calls) <= 1:
        return [call() for call in calls]
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
    for future in futures:
        error = future.exception()
        if error is not None:
            raise error
    return [future.result() for future in futures]


def _cluster_config(net_ticktime: int, partition_handling: str) -> str:
    return f"cluster_partition_handling = {partition_handling}\nnet_ticktime = {net_ticktime}\n"


class _Recipe:
    """How the nodes of one cluster are made: the machine's ``rabbitmq-server`` (3.10),
    or a Debian root with one epmd the nodes share (4.x; ``close`` ends it)."""

    def __init__(self, version: str, server: str | None, boot_timeout: float | None) -> None:
        self.version = version
        self._boot_timeout = boot_timeout
        self._cookie = secrets.token_hex(20).upper()
        self._tag = secrets.token_hex(2)
        self._epmd: subprocess.Popen[bytes] | None = None
        self.epmd_port: int | None = None
        self._server = server
        if version == DEFAULT_VERSION:
            self._server = server or _find_rabbitmq_server()
            if self._server is None:
                raise BrokerUnavailable(
                    "a cluster of the kit's own needs rabbitmq-server, which is not installed.\n"
                    + HOW_TO_GET_A_BROKER
                )
            return
        from ._provider_chroot import start_epmd
        from ._rootfs import ensure_root

        if os.geteuid() != 0:
            raise BrokerUnavailable(
                f"a RabbitMQ {version} cluster of the kit's own runs in a Debian root with "
                "chroot, which needs root"
            )
        self._root = ensure_root(version)
        self.epmd_port = free_port()
        self._epmd = start_epmd(self._root, self.epmd_port, what=f"the RabbitMQ {version} cluster")

    def node(self, index: int, more_config: str) -> _OwnNode:
        from ._own import _reap_orphans

        common: dict[str, Any] = {
            "reap_orphans": _reap_orphans,
            "boot_timeout": self._boot_timeout,
            "cookie": self._cookie,
            "more_config": more_config,
            "advanced_config": _ADVANCED_CONFIG,
            "name_tag": f"c{self._tag}n{index + 1}-",
        }
        if self._server is not None:
            return _OwnNode(self._server, **common)
        from ._provider_chroot import _ChrootNode

        return _ChrootNode(self.version, root=self._root, epmd_port=self.epmd_port, **common)

    def close(self) -> None:
        epmd, self._epmd = self._epmd, None
        if epmd is not None:
            epmd.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                epmd.wait(5)


def own_cluster(
    version: str | None = None,
    *,
    size: int = 3,
    net_ticktime: int = DEFAULT_NET_TICKTIME,
    partition_handling: str = DEFAULT_PARTITION_HANDLING,
    server: str | None = None,
    boot_timeout: float | None = None,
) -> ClusterHandle:
    """Boot a throwaway cluster of ``size`` nodes of RabbitMQ ``version`` (default: the
    one ``ACKKIT_TEST_RABBITMQ`` asks for; "3.10": the machine's ``rabbitmq-server``, or
    ``server``; "4.0"/"4.3": in a Debian root, as root), joined to the first node, and
    return its handle once every node reports all of them running. Closing the handle
    removes the cluster.

    The nodes boot in parallel; call this from a thread that lives as long as the
    cluster (the shared epmd of a 4.x cluster dies with the thread that started it)."""
    version = wanted_version(version)
    if size < 1:
        raise ValueError("a cluster has at least one node")
    started = time.monotonic()
    recipe = _Recipe(version, server, boot_timeout)
    if partition_handling not in PARTITION_HANDLING:
        raise ValueError(f"partition_handling is one of {', '.join(PARTITION_HANDLING)}")
    more = _cluster_config(net_ticktime, partition_handling)
    nodes: list[_OwnNode | None] = [None] * size

    def boot(index: int) -> None:
        nodes[index] = recipe.node(index, more)

    try:
        _in_parallel([functools.partial(boot, i) for i in range(size)])
    except BaseException:
        for node in nodes:
            if node is not None:
                node.close()
        recipe.close()
        raise
    handle = ClusterHandle(
        [n for n in nodes if n is not None],
        version=version,
        net_ticktime=net_ticktime,
        epmd_port=recipe.epmd_port,
        on_close=recipe.close,
    )
    try:
        _join(handle)
        handle.wait_running()
    except BaseException:
        handle.close()
        raise
    handle.start_seconds = time.monotonic() - started
    log.info(
        "RabbitMQ %s cluster of %d nodes up in %.1fs: %s",
        version,
        size,
        handle.start_seconds,
        ", ".join(n.masked_url for n in handle.nodes),
    )
    return handle


JOIN_STEP_TIMEOUT = 240.0
"""Each step of a join, at most (s). A stop_app of a freshly booted node took more than
60 s once on a loaded machine (a make test leg beside two busy loops and another suite);
the steps wait for the node, so a generous ceiling costs nothing when it is quick."""


def _join(cluster: ClusterHandle) -> None:
    """Nodes 2.. join node 1: stop_app (in parallel), join_cluster (one at a time, as
    RabbitMQ asks), start_app (in parallel)."""
    first, rest = cluster.nodes[0], cluster.nodes[1:]
    if not rest:
        return
    t = JOIN_STEP_TIMEOUT
    _in_parallel([functools.partial(n.ctl, "stop_app", timeout=t) for n in rest])
    for node in rest:
        node.ctl("join_cluster", str(first.node_name), timeout=t)
    _in_parallel([functools.partial(n.ctl, "start_app", timeout=t) for n in rest])


# -- the command ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ackkit_testkit._cluster",
        description="Start a throwaway RabbitMQ cluster of the test kit's own on this machine, "
        "print its nodes' URLs and keep it until interrupted (Ctrl-C, SIGTERM); then every "
        "node is killed and its data removed.",
    )
    parser.add_argument(
        "--rabbitmq",
        default=None,
        metavar="VERSION",
        help="3.10 (the machine's rabbitmq-server) or 4.0 / 4.3 (a Debian root, as root); "
        "default: ACKKIT_TEST_RABBITMQ, else 3.10",
    )
    parser.add_argument("--nodes", type=int, default=3, help="how many nodes (3)")
    parser.add_argument(
        "--net-ticktime",
        type=int,
        default=DEFAULT_NET_TICKTIME,
        help=f"the nodes' net_ticktime in seconds ({DEFAULT_NET_TICKTIME})",
    )
    parser.add_argument(
        "--partition-handling",
        choices=PARTITION_HANDLING,
        default=DEFAULT_PARTITION_HANDLING,
        help=f"cluster_partition_handling ({DEFAULT_PARTITION_HANDLING})",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON line (version, urls, node names) once the cluster is up",
    )
    parser.add_argument(
        "--for",
        dest="seconds",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop after SECONDS (default: until interrupted)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    done = threading.Event()

    def finish(*_: object) -> None:
        done.set()

    signal.signal(signal.SIGTERM, finish)
    signal.signal(signal.SIGINT, finish)
    try:
        cluster = own_cluster(
            args.rabbitmq,
            size=args.nodes,
            net_ticktime=args.net_ticktime,
            partition_handling=args.partition_handling,
        )
    except (BrokerUnavailable, BrokerError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    with cluster:
        if args.json:
            line = {
                "rabbitmq": cluster.version,
                "urls": cluster.urls,
                "nodes": cluster.node_names,
                "epmd_port": cluster.epmd_port,
                "start_seconds": round(cluster.start_seconds or 0.0, 1),
            }
            print(json.dumps(line), flush=True)
        else:
            print(f"RabbitMQ {cluster.version} cluster up in {cluster.start_seconds:.1f}s:")
            for index, node in enumerate(cluster.nodes):
                print(f"  node {index}: {node.node_name}  {node.url}")
            print("Ctrl-C (or SIGTERM) stops it and removes its data.", flush=True)
        done.wait(args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
