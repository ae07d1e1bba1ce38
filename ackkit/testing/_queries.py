"""What the kit asks a node about its queues, exchanges and connections, and how it reads
the answers.

Two ways to ask: an Erlang expression evaluated on the node through erl_call
(fast, only for nodes of the kit's own), and rabbitmqctl's JSON output (every
broker the kit can reach with rabbitmqctl). Both end in :class:`QueueCounts`.
"""

from __future__ import annotations

import dataclasses
import json

from ..cli._queues import COUNTS
from ._errors import BrokerError

__all__ = ["DeclaredQueue", "QueueCounts"]


@dataclasses.dataclass(frozen=True)
class QueueCounts:
    """Message counts of one queue, as the broker reports them right now:
    ``counts.ready`` (a frozen dataclass), or ``counts["ready"]`` as the docs' table of
    helpers reads (the same four names; another raises KeyError)."""

    ready: int
    unacked: int
    total: int
    consumers: int

    def __getitem__(self, name: str) -> int:
        if name not in _COUNT_NAMES:
            raise KeyError(f"{name!r}: a queue's counts are {', '.join(_COUNT_NAMES)}")
        value: int = getattr(self, name)
        return value


_COUNT_NAMES = tuple(f.name for f in dataclasses.fields(QueueCounts))


# --------------------------------------------------------------------------- Erlang (erl_call)


def _erl_binary(text: str) -> str:
    """An Erlang binary literal for ``text`` that needs no escaping: <<104,105>>."""
    return "<<" + ",".join(str(b) for b in text.encode("utf-8")) + ">>"


# C(Q) -> [ready, unacked, total, consumers]. A quorum queue is asked through Ra
# (its leader's state right now): the queue's info/metrics lag by up to ~5 s (the
# metrics tick), seen on 3.10 and 4.3. Any other queue, or a Ra query that fails,
# answers through rabbit_amqqueue:info.
_COUNT_FUN = (
    "C = fun(Q) -> Ra = case amqqueue:get_type(Q) of rabbit_quorum_queue -> "
    "try ra:local_query(amqqueue:get_pid(Q), fun(S) -> "
    "[rabbit_fifo:query_messages_ready(S), rabbit_fifo:query_messages_checked_out(S), "
    "rabbit_fifo:query_messages_total(S), rabbit_fifo:query_consumer_count(S)] end) of "
    "{ok, {_, L}, _} when is_list(L) -> L; _ -> none catch _:_ -> none end; "
    "_ -> none end, "
    "case Ra of none -> I = rabbit_amqqueue:info(Q, [messages_ready, "
    "messages_unacknowledged, messages, consumers]), [proplists:get_value(K, I) || K <- "
    "[messages_ready, messages_unacknowledged, messages, consumers]]; _ -> Ra end end, "
)


def _queue_counts_expr(vhost: str, queue: str) -> str:
    """Answers "OK;r,u,t,c", "OK;missing" or "OK;error" for one queue."""
    return (
        _COUNT_FUN + "R = try case rabbit_amqqueue:lookup(rabbit_misc:r("
        f"{_erl_binary(vhost)}, queue, {_erl_binary(queue)})) of "
        '{ok, Q} -> io_lib:format("~w,~w,~w,~w", C(Q)); '
        '_ -> "missing" end catch _:_ -> "error" end, '
        'lists:flatten(["OK;", R]).'
    )


def _read_queue_counts(out: str) -> QueueCounts | None:
    """The counts in an answer to ``_queue_counts_expr`` (after "OK;"), else None."""
    parts = out.split(",")
    if len(parts) == 4 and all(p.isdigit() for p in parts):
        return QueueCounts(*(int(p) for p in parts))
    return None


def _hex(expr: str) -> str:
    """An Erlang list expression: the bytes of the binary ``expr`` as hex digits."""
    return f'[io_lib:format("~2.16.0b", [B]) || <<B>> <= {expr}]'


def _counts_all_expr(vhost: str) -> str:
    """Answers "OK;" then "<hex name>,r,u,t,c;" for every queue of ``vhost``."""
    return (
        _COUNT_FUN + f"L = rabbit_amqqueue:list({_erl_binary(vhost)}), "
        f'lists:flatten(["OK;" | [[{_hex("element(4, amqqueue:get_name(Q))")}, '
        'io_lib:format(",~w,~w,~w,~w;", C(Q))] || Q <- L]]).'
    )


def _read_counts_all(out: str) -> dict[str, QueueCounts]:
    """The table in an answer to ``_counts_all_expr``; ValueError or TypeError when
    the answer is not understood."""
    result: dict[str, QueueCounts] = {}
    for item in filter(None, out.split(";")):
        hexname, *values = item.split(",")
        name = bytes.fromhex(hexname).decode("utf-8")
        result[name] = QueueCounts(*(int(v) for v in values))
    return result


def _exchange_types_expr(vhost: str) -> str:
    """Answers "OK;" then "<hex name>,<type>;" for every exchange of ``vhost``."""
    return (
        f'lists:flatten(["OK;" | [[{_hex("element(4, element(2, X))")}, ",", '
        'atom_to_list(element(3, X)), ";"] || X <- rabbit_exchange:list('
        f"{_erl_binary(vhost)})]])."
    )


def _read_exchange_types(out: str) -> dict[str, str]:
    """The exchanges in an answer to ``_exchange_types_expr``; ValueError when the
    answer is not understood."""
    result: dict[str, str] = {}
    for item in filter(None, out.split(";")):
        hexname, kind = item.split(",")
        result[bytes.fromhex(hexname).decode("utf-8")] = kind
    return result


def _bindings_expr(vhost: str, queue: str) -> str:
    """Answers "OK;" then "<hex source>,<hex routing key>;" for every binding of the
    queue (the default exchange's included, as rabbitmqctl lists it)."""
    return (
        f"R = rabbit_misc:r({_erl_binary(vhost)}, queue, {_erl_binary(queue)}), "
        "Bs = case rabbit_amqqueue:lookup(R) of {ok, _} -> "
        "rabbit_binding:list_for_destination(R); _ -> [] end, "
        f'lists:flatten(["OK;" | [[{_hex("element(4, element(2, Bd))")}, ",", '
        f'{_hex("element(3, Bd)")}, ";"] || Bd <- Bs]]).'
    )


def _read_bindings(out: str) -> set[tuple[str, str]]:
    """The (source, routing key) pairs in an answer to ``_bindings_expr``; ValueError
    when the answer is not understood."""
    result: set[tuple[str, str]] = set()
    for item in filter(None, out.split(";")):
        source, key = item.split(",")
        result.add((bytes.fromhex(source).decode("utf-8"), bytes.fromhex(key).decode("utf-8")))
    return result


@dataclasses.dataclass(frozen=True)
class DeclaredQueue:
    """A queue as the node holds it: its ``type`` ("classic", "quorum", "stream") and
    the ``arguments`` it was declared with (strings, numbers and booleans as such; a
    table or an array as the node prints it)."""

    type: str
    arguments: dict[str, object]


def _declared_expr(vhost: str, queue: str) -> str:
    """Answers "OK;missing", or "OK;<type module>;" then "<hex key>,<tag><value>;" for
    each argument: s<hex> a string, i an integer, b a boolean, f a float, t<hex> any
    other term as ``~0p`` prints it."""
    return (
        f"R = rabbit_misc:r({_erl_binary(vhost)}, queue, {_erl_binary(queue)}), "
        f"H = fun(B) -> {_hex('B')} end, "
        'V = fun(_, X) when is_binary(X) -> ["s", H(X)]; '
        '(_, X) when is_integer(X) -> ["i", integer_to_list(X)]; '
        '(_, X) when is_boolean(X) -> ["b", atom_to_list(X)]; '
        '(_, X) when is_float(X) -> ["f", float_to_list(X)]; '
        '(_, X) -> ["t", H(list_to_binary(io_lib:format("~0p", [X])))] end, '
        "A = case rabbit_amqqueue:lookup(R) of {ok, Q} -> "
        '[atom_to_list(amqqueue:get_type(Q)), ";" | [[H(K), ",", V(T, X), ";"] '
        '|| {K, T, X} <- amqqueue:get_arguments(Q)]]; _ -> "missing" end, '
        'lists:flatten(["OK;", A]).'
    )


def _read_declared(out: str) -> DeclaredQueue | None:
    """The queue in an answer to ``_declared_expr`` (None: "missing"); ValueError when
    the answer is not understood."""
    if out == "missing":
        return None
    module, *items = out.split(";")
    kind = module.removeprefix("rabbit_").removesuffix("_queue")
    arguments: dict[str, object] = {}
    for item in filter(None, items):
        key, value = item.split(",")
        tag, raw = value[:1], value[1:]
        read: object
        if tag == "s" or tag == "t":
            read = bytes.fromhex(raw).decode("utf-8")
        elif tag == "i":
            read = int(raw)
        elif tag == "b":
            read = raw == "true"
        elif tag == "f":
            read = float(raw)
        else:
            raise ValueError(f"argument value {value!r}")
        arguments[bytes.fromhex(key).decode("utf-8")] = read
    return DeclaredQueue(kind, arguments)


def _read_declared_json(text: str, queue: str) -> DeclaredQueue | None:
    """``queue`` in ``rabbitmqctl list_queues name type arguments --formatter json``:
    arguments as a mapping, or (3.x) a list of [key, type, value]."""
    for row in _json_rows(text, "list_queues"):
        if row["name"] == queue:
            args = row.get("arguments") or {}
            if isinstance(args, list):
                args = {a[0]: a[-1] for a in args}
            if not isinstance(args, dict):
                raise BrokerError(f"unexpected list_queues arguments: {args!r}")
            return DeclaredQueue(str(row["type"]), dict(args))
    return None


def _close_all_expr(reason: str) -> str:
    """Force-closes every client connection in the cluster; answers "OK;<how many>"."""
    return (
        "Ps = rabbit_networking:connections(), "
        f"[rabbit_networking:close_connection(P, binary_to_list({_erl_binary(reason)})) "
        '|| P <- Ps], lists:flatten(["OK;", integer_to_list(length(Ps))]).'
    )


def _close_named_expr(name: str, reason: str) -> str:
    """Force-closes the client connections named ``name`` (their ``connection_name``
    client property) anywhere in the cluster; answers "OK;<how many>"."""
    return (
        f"N = {_erl_binary(name)}, Named = fun(P) -> case catch "
        "rabbit_networking:connection_info(P, [client_properties]) of "
        "[{client_properties, Props}] when is_list(Props) -> "
        'lists:member({<<"connection_name">>, longstr, N}, Props); _ -> false end end, '
        "Ps = [P || P <- rabbit_networking:connections(), Named(P)], "
        f"[rabbit_networking:close_connection(P, binary_to_list({_erl_binary(reason)})) "
        '|| P <- Ps], lists:flatten(["OK;", integer_to_list(length(Ps))]).'
    )


# --------------------------------------------------------------------------- rabbitmqctl (JSON)


def _parse_list_queues_json(text: str) -> dict[str, QueueCounts]:
    text = text.strip()
    start = text.find("[")
    if start < 0:
        raise BrokerError(f"unexpected list_queues output: {text[:500]!r}")
    try:
        rows = json.loads(text[start:])
    except ValueError as exc:
        raise BrokerError(f"unexpected list_queues output: {text[:500]!r}") from exc
    result: dict[str, QueueCounts] = {}
    for row in rows:
        name = str(row["name"])
        values = [row.get(k) for k in COUNTS]
        if not all(isinstance(v, int) for v in values):
            raise BrokerError(f"queue {name!r} has no counts (is it down?): {row}")
        result[name] = QueueCounts(*(int(v) for v in values))
    return result


def _json_rows(text: str, command: str) -> list[dict[str, object]]:
    """The rows of ``rabbitmqctl <command> --formatter json`` (none when it printed no
    table); BrokerError when the output is not JSON."""
    start = text.find("[")
    try:
        rows: list[dict[str, object]] = json.loads(text[start:]) if start >= 0 else []
    except ValueError as exc:
        raise BrokerError(f"unexpected {command} output: {text[:500]!r}") from exc
    return rows
