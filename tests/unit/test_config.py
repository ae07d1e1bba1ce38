"""Wrong options are refused at once, naming the option; handlers bind as documented.

No broker: the policy values, `listener()` registration, the pull / DLQ entry points
(refused before they connect), the handler binding table and body decoding.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import math
import time
import typing
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import ackkit
from ackkit import (
    AckMode,
    App,
    Batch,
    Consumer,
    Delivery,
    Flow,
    FlushPolicy,
    Queue,
    Retry,
    RetryStrategy,
)
from ackkit._app.handler import Binding, Decoder, is_coroutine_callable
from ackkit._app.listener_options import DEPRECATED
from ackkit._async.app import AsyncApp
from ackkit._async.delivery import AsyncDelivery
from ackkit._core.listener import ListenerCore
from ackkit._core.policy import MAX_DELAY_TIERS, ListenerPolicy
from ackkit.errors import BadPayload

FAST = 0.05  # seconds: a refusal is a check, never a connection attempt
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def refused(fn: Callable[[], Any], option: str) -> BaseException:
    """fn() raises TypeError/ValueError naming `option`, in under FAST seconds (the best
    of three runs: a loaded machine may pause any one of them)."""
    took = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        with pytest.raises((TypeError, ValueError)) as info:
            fn()
        took = min(took, time.perf_counter() - t0)
        if took < FAST:
            break
    assert took < FAST, f"refusing {option} took {took * 1000:.0f} ms"
    assert option in str(info.value), f"{option!r} not named in: {info.value}"
    return info.value


def handler(d: Delivery) -> None:
    pass


# -- hostile values ------------------------------------------------------------------

NOT_INT = st.one_of(
    st.booleans(),
    st.floats(allow_nan=True),
    st.text(max_size=3),
    st.none(),
    st.just([1]),
)
NOT_NUMBER = st.one_of(
    st.booleans(),
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.text(max_size=3),
    st.none(),
    st.just((1,)),
)


# -- Retry ------------------------------------------------------------------------------


def naive_delay(r: Retry, attempt: int) -> float:
    try:
        d = r.initial_interval * r.multiplier ** max(attempt - 1, 0)
    except OverflowError:
        d = math.inf
    return min(d, r.max_interval)


def ms(s: float) -> int:
    return max(math.ceil(s * 1000), 1)


valid_retry = st.builds(
    Retry,
    max_attempts=st.integers(1, 300),
    initial_interval=st.floats(0, 100, allow_nan=False),
    multiplier=st.floats(1, 10, allow_nan=False),
    max_interval=st.floats(0, 1000, allow_nan=False),
    jitter=st.floats(0, 0.99),
    # the exponential strategies; QUORUM_DELAYED's linear delays: tests/unit/test_brokers.py
    strategy=st.sampled_from([RetryStrategy.BROKER, RetryStrategy.IN_PROCESS]),
)


@SETTINGS
@given(st.data())
def test_valid_retry_matches_the_plain_formula(data: st.DataObject) -> None:
    try:
        r = data.draw(valid_retry)
    except ValueError as exc:  # only: too many distinct broker delays
        assert "distinct delays" in str(exc)
        return
    n = r.max_attempts
    want = sorted({ms(naive_delay(r, a)) for a in range(1, n)})
    if r.strategy is RetryStrategy.BROKER or len(want) <= MAX_DELAY_TIERS:
        assert r.delay_tiers_ms() == want
    for a in (1, 2, n, n + 5):
        assert r.delay(a) == naive_delay(r, a)
        assert r.tier_for(a) == ms(naive_delay(r, a))
    total = sum(naive_delay(r, a) for a in range(1, n))
    assert math.isclose(r.total_delay(), total, rel_tol=1e-9, abs_tol=1e-9)


@SETTINGS
@given(
    max_attempts=st.integers(2, 1_000_000),
    initial=st.floats(0.0001, 10),
    mult=st.floats(1, 1e6),
    cap=st.floats(0, 10_000),
)
def test_retry_is_fast_and_never_overflows(
    max_attempts: int, initial: float, mult: float, cap: float
) -> None:
    took = math.inf
    for _ in range(3):  # the best of three: a loaded machine may pause any one run
        t0 = time.perf_counter()
        r = Retry(max_attempts, initial, mult, cap, strategy=RetryStrategy.IN_PROCESS)
        r.total_delay(), r.delay(max_attempts), r.tier_for(max_attempts)
        took = min(took, time.perf_counter() - t0)
    assert took < FAST
    tiers = r.delay_tiers_ms()
    assert tiers == sorted(set(tiers))
    assert all(1 <= t <= ms(cap) for t in tiers)
    assert r.delay(max_attempts) <= cap and r.tier_for(max_attempts) <= ms(cap)
    assert math.isfinite(r.total_delay()) and r.total_delay() <= (max_attempts - 1) * cap + 1e-6


def test_the_reported_retry_works() -> None:
    r = Retry(max_attempts=2000, max_interval=0.1)  # was an OverflowError at start
    assert r.delay_tiers_ms() == [100]
    assert r.delay(1999) == 0.1
    assert math.isclose(r.total_delay(), 1999 * 0.1)


def test_too_many_broker_delay_queues_are_refused() -> None:
    refused(
        lambda: Retry(max_attempts=10_000, initial_interval=0.001, multiplier=1.001),
        "distinct delays",
    )


@pytest.mark.parametrize(
    "option,bad",
    [
        ("max_attempts", 0),
        ("max_attempts", -1),
        ("max_attempts", 10**7),
        ("max_attempts", True),
        ("max_attempts", 2.0),
        ("max_attempts", "3"),
        ("initial_interval", -1),
        ("initial_interval", math.nan),
        ("initial_interval", math.inf),
        ("initial_interval", 10**9),
        ("max_interval", math.nan),
        ("max_interval", -0.5),
        ("multiplier", 0.5),
        ("multiplier", math.nan),
        ("multiplier", False),
        ("jitter", 1.0),
        ("jitter", -0.1),
        ("jitter", math.nan),
        ("strategy", "later"),
        ("retry_on", "ValueError"),
        ("retry_on", (ValueError, 3)),
        ("retry_on", int),
        ("fatal", ValueError("not a type")),
    ],
)
def test_retry_refuses(option: str, bad: Any) -> None:
    refused(lambda: Retry(**{option: bad}), f"Retry.{option}")


@SETTINGS
@given(option=st.sampled_from(["max_attempts"]), bad=NOT_INT)
def test_retry_refuses_non_ints(option: str, bad: Any) -> None:
    refused(lambda: Retry(**{option: bad}), f"Retry.{option}")


@SETTINGS
@given(
    option=st.sampled_from(["initial_interval", "max_interval", "multiplier", "jitter"]),
    bad=NOT_NUMBER,
)
def test_retry_refuses_non_numbers(option: str, bad: Any) -> None:
    refused(lambda: Retry(**{option: bad}), f"Retry.{option}")


def test_retry_coerces_friendly_spellings() -> None:
    r = Retry(max_attempts=3, retry_on=TimeoutError, strategy="in_process")  # type: ignore[arg-type]
    assert r.retry_on == (TimeoutError,) and r.strategy is RetryStrategy.IN_PROCESS
    assert r.should_retry(TimeoutError()) and not r.should_retry(ValueError())


@pytest.mark.parametrize(
    "kw,option",
    [
        ({"max_pending": 0, "interval": 0.1}, "max_pending"),
        ({"max_pending": True, "interval": 0.1}, "max_pending"),
        ({"max_pending": 10, "interval": math.nan}, "interval"),
        ({"max_pending": 10, "interval": -1}, "interval"),
        ({"max_pending": 10, "interval": math.inf}, "interval"),
    ],
)
def test_flush_policy_refuses(kw: dict[str, Any], option: str) -> None:
    refused(lambda: FlushPolicy(**kw), f"FlushPolicy.{option}")


# -- listener() --------------------------------------------------------------------------


def grouped(queue: Any, kw: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """listener()'s arguments in the grouped spelling, from a case written with the flat
    option names (`prefetch`, `batch_size`, ...): the tables below are written once, and
    test_listener_spelling runs them again in the deprecated flat spelling."""
    kw = dict(kw)
    groups: dict[str, dict[str, Any]] = {}
    for old, (group, field) in DEPRECATED.items():
        if old in kw:
            groups.setdefault(group, {})[field] = kw.pop(old)
    if "queue" in groups:
        queue = Queue(queue, **groups["queue"])
    if "consumer" in groups:
        kw["consumer"] = Consumer(**groups["consumer"])
    if "batch" in groups:
        b = groups["batch"]
        if "size" not in b:
            Batch(1, **b)  # checked; a batch_timeout without batch_size never applied
        elif b["size"] is not None:
            kw["batch"] = Batch(**b)
    if "flow" in groups:
        kw["flow"] = Flow(**groups["flow"])
    return queue, kw


def register(app: Any = None, queue: Any = "orders", fn: Any = handler, **kw: Any) -> Any:
    app = app or App()
    queue, kw = grouped(queue, kw)
    app.listener(queue, **kw)(fn)
    return app


@SETTINGS
@given(prefetch=st.integers(0, 65535), batch=st.none() | st.integers(1, 65535))
def test_valid_prefetch_and_batch_size_are_kept(prefetch: int, batch: int | None) -> None:
    if batch is not None and prefetch and batch > prefetch:
        refused(
            lambda: register(fn=lambda ds: None, prefetch=prefetch, batch_size=batch),
            "Batch.size",
        )
        return

    def many(ds: list[Delivery]) -> None:
        pass

    app = register(fn=many if batch else handler, prefetch=prefetch, batch_size=batch)
    (spec,) = app.specs
    assert spec.policy.prefetch == prefetch and spec.batch_size == batch
    assert spec.policy.flush_policy.max_pending >= 1


@SETTINGS
@given(bad=st.integers(65536, 10**12) | st.integers(-(10**6), -1) | NOT_INT)
def test_prefetch_out_of_range_is_refused(bad: Any) -> None:
    refused(lambda: register(prefetch=bad), "prefetch")


OPTION_CASES: list[tuple[dict[str, Any], str]] = [
    ({"dead_letter": ""}, "dead_letter"),
    ({"dead_letter": "orders"}, "dead_letter"),
    ({"dead_letter": "{queue}"}, "dead_letter"),
    ({"dead_letter": "orders.retry.1000ms"}, "dead_letter"),
    ({"dead_letter": "{nope}.dlq"}, "dead_letter"),
    ({"dead_letter": "{"}, "dead_letter"),
    ({"dead_letter": "x" * 256}, "dead_letter"),
    ({"dead_letter": 5}, "dead_letter"),
    ({"dead_letter": "amq.dead"}, "dead_letter"),
    ({"dead_letter": "bad\x00name"}, "dead_letter"),
    ({"ack_mode": "sometimes"}, "ack_mode"),
    ({"ack_mode": 3}, "ack_mode"),
    ({"on_unsettled": "shrug"}, "on_unsettled"),
    ({"concurrency": 0}, "concurrency"),
    ({"concurrency": True}, "concurrency"),
    ({"concurrency": 2.5}, "concurrency"),
    ({"concurrency": 10**6}, "concurrency"),
    ({"max_concurrency": 0}, "concurrency"),
    ({"max_concurrency": "8"}, "concurrency"),
    ({"batch_size": 0}, "Batch.size"),
    ({"batch_size": True}, "Batch.size"),
    ({"batch_timeout": math.nan}, "Batch.timeout"),
    ({"batch_timeout": -1}, "Batch.timeout"),
    ({"batch_timeout": math.inf}, "Batch.timeout"),
    ({"max_body_size": 0}, "max_body_size"),
    ({"max_body_size": True}, "max_body_size"),
    ({"max_body_size": 1.5}, "max_body_size"),
    ({"check_content_type": "no"}, "check_content_type"),
    ({"declare": 0}, "declare"),
    ({"declare": None}, "declare"),
    ({"retry": 3}, "retry"),
    ({"flush": {"max_pending": 1}}, "flush"),
    ({"name": ""}, "name"),
    ({"name": 7}, "name"),
    ({"queue_arguments": {"x-queue-type": "stream"}}, "x-queue-type"),
    ({"queue_arguments": {"x-queue-type": 1}}, "x-queue-type"),
    ({"queue_arguments": {"x-message-ttl": -5}}, "x-message-ttl"),
    ({"queue_arguments": {"x-message-ttl": "1000"}}, "x-message-ttl"),
    ({"queue_arguments": {1: "x"}}, "Queue.arguments"),
    ({"queue_arguments": {"x-thing": {1, 2}}}, "Queue.arguments"),
    ({"queue_arguments": {"x-thing": math.nan}}, "Queue.arguments"),
    ({"queue_arguments": ["x-queue-type"]}, "Queue.arguments"),
    # accepted by their types, then unencodable at start(): struct.error, a reconnect loop
    # on a key over 255 bytes, a UnicodeEncodeError that stopped the I/O thread
    ({"queue_arguments": {"x-max-length": 2**70}}, "Queue.arguments"),
    ({"queue_arguments": {"k" * 300: 1}}, "Queue.arguments"),
    ({"queue_arguments": {"x-thing": "\udcff"}}, "Queue.arguments"),
    ({"queue_arguments": {"x-thing": [{"\udcff": 1}]}}, "Queue.arguments"),
    ({"consumer_arguments": {"x-thing": -(2**64)}}, "Consumer.arguments"),
    ({"consumer_arguments": {"k" * 256: "v"}}, "Consumer.arguments"),
    (
        {
            "queue_arguments": {
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": "orders",
            }
        },
        "Queue.arguments",
    ),
    ({"ack_mode": AckMode.NONE, "retry": Retry(max_attempts=3)}, "AckMode.NONE"),
]


def test_exchange_and_bind_arguments_must_be_encodable() -> None:
    from ackkit.topology import Bind, Exchange

    refused(lambda: Bind("amq.headers", "", {"x-match": "\ud800"}), "bind arguments")
    refused(
        lambda: Exchange("ex", arguments={"alternate-exchange": "a" * 2**8 + "\ud800"}),
        "Exchange arguments",
    )
    refused(lambda: Exchange("ex", arguments={"x" * 256: 1}), "Exchange arguments")


@pytest.mark.parametrize("kw,option", OPTION_CASES)
def test_listener_refuses(kw: dict[str, Any], option: str) -> None:
    app = App()
    refused(lambda: register(app, **kw), option)
    assert app.specs == []  # nothing half-registered


@pytest.mark.parametrize(
    "queue",
    ["", "x" * 256, "é" * 128, "a\nb", "tab\there", "\x7f", "\ud800", 5, None, b"orders"],
)
def test_queue_names_the_broker_would_refuse(queue: Any) -> None:
    refused(lambda: register(queue=queue), "queue")


def test_a_long_queue_leaves_no_room_for_its_dead_letter_or_delay_queues() -> None:
    refused(lambda: register(queue="q" * 252), "dead_letter")  # q...q.dlq is 256 bytes
    register(queue="q" * 251)
    refused(lambda: register(queue="q" * 240, retry=Retry(max_attempts=3)), "retry delay")
    register(
        queue="q" * 240,
        retry=Retry(max_attempts=3, strategy=RetryStrategy.IN_PROCESS),
        dead_letter="short.dlq",
    )


def test_amq_prefix_only_matters_for_queues_ackkit_declares() -> None:
    refused(lambda: register(queue="amq.orders"), "queue")
    register(queue="amq.orders", declare=False, dead_letter="orders.dlq")


@SETTINGS
@given(st.text(min_size=1, max_size=80).filter(lambda s: s.isprintable()))
def test_printable_queue_names_are_accepted(queue: str) -> None:
    if queue.startswith("amq.") or len(queue.encode()) > 251:
        return
    app = register(queue=queue, retry=Retry(max_attempts=2, initial_interval=0.1))
    (spec,) = app.specs
    assert spec.queue == queue
    assert spec.policy.dead_letter_queue in (f"{queue}.dlq", None)


def test_duplicate_listener_names_are_refused() -> None:
    app = register(queue="a", name="orders")
    refused(lambda: register(app, queue="b", name="orders"), "orders")

    def on_order(d: Delivery) -> None:
        pass

    app.listener("c")(on_order)
    refused(lambda: app.listener("c")(on_order), "c:on_order")
    assert len(app.specs) == 2


@pytest.mark.parametrize(
    "kw,option",
    [
        ({"heartbeat": -1}, "heartbeat"),
        ({"heartbeat": 70000}, "heartbeat"),
        ({"heartbeat": 1.5}, "heartbeat"),
        ({"shutdown_timeout": math.nan}, "shutdown_timeout"),
        ({"shutdown_timeout": -1}, "shutdown_timeout"),
        ({"reconnect_max_interval": 0}, "reconnect_max_interval"),
        ({"reconnect_max_interval": math.inf}, "reconnect_max_interval"),
        ({"startup_timeout": 0}, "startup_timeout"),
        ({"startup_timeout": "60"}, "startup_timeout"),
        ({"connection_name": None}, "connection_name"),
    ],
)
@pytest.mark.parametrize("cls", [App, AsyncApp])
def test_app_refuses(cls: type, kw: dict[str, Any], option: str) -> None:
    refused(lambda: cls("amqp://guest:guest@127.0.0.1:5672/%2f", **kw), option)


APP_OPTIONS = {
    "heartbeat": int,
    "shutdown_timeout": float,
    "reconnect_max_interval": float,
    "startup_timeout": float,
    "connection_name": str,
}


@pytest.mark.parametrize("cls", [App, AsyncApp])
def test_app_options_are_named_typed_and_documented(cls: type) -> None:
    """No option hides behind **kw: IDEs and help() see each one, with its type and doc."""
    params = inspect.signature(cls).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values())
    hints = typing.get_type_hints(cls.__init__)
    doc = inspect.getdoc(cls.__mro__[1]) or ""
    for name, tp in APP_OPTIONS.items():
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert hints[name] is tp, name
        assert f"`{name}`" in doc, name
    assert "tls" in params and "`tls`" in doc
    refused(lambda: cls(no_such_option=1), "no_such_option")


@pytest.mark.parametrize("cls", [App, AsyncApp])
def test_app_settings_are_one_frozen_value(cls: type) -> None:
    app = cls("amqp://u:secret@h:5672/%2f", heartbeat=5, shutdown_timeout=2.5)
    s = app.settings
    assert (s.heartbeat, s.shutdown_timeout, s.url) == (5, 2.5, "amqp://u:secret@h:5672/%2f")
    assert "secret" not in s.safe_url and "secret" not in repr(app)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.heartbeat = 1  # type: ignore[misc]
    app.heartbeat = 1  # checked again, into a new frozen value
    assert app.settings.heartbeat == 1 and s.heartbeat == 5
    refused(lambda: setattr(app, "heartbeat", -1), "heartbeat")
    refused(lambda: setattr(app, "startup_timeout", 0), "startup_timeout")
    app.url = "amqp://other:5672/%2f"  # the CLI's --url: checked again
    assert app.settings.url == "amqp://other:5672/%2f" and app.settings.heartbeat == 1
    refused(lambda: setattr(app, "url", "http://nope/"), "url")
    refused(lambda: cls(tls="yes"), "tls")
    assert app.stats() == {} and not app.is_running


@pytest.mark.parametrize(
    "url", ["", "http://host/", "127.0.0.1:5672", "amqp://host:port/", 5, None]
)
def test_urls_that_cannot_work_are_refused(url: Any) -> None:
    refused(lambda: App(url), "url")
    refused(lambda: ackkit.pull.PullConnection(url), "url")
    refused(lambda: ackkit.dead_letters.DeadLetterQueue(url, "orders.dlq"), "url")


def test_pull_and_dlq_tools_refuse_before_connecting() -> None:
    url = "amqp://guest:guest@127.0.0.1:1/%2f"  # nothing listens there
    refused(lambda: ackkit.pull.PullConnection(url, heartbeat=-3), "heartbeat")
    refused(lambda: ackkit.dead_letters.DeadLetterQueue(url, ""), "queue")
    refused(lambda: ackkit.dead_letters.DeadLetterQueue(url, "x" * 300), "queue")
    refused(
        lambda: ackkit.dead_letters.replay_dead_letters(url, "orders.dlq", message_ids="m-17"),
        "message_ids",
    )
    refused(
        lambda: ackkit.dead_letters.replay_dead_letters(url, "orders.dlq", error_type=3),
        "error_type",
    )  # type: ignore[arg-type]


def test_pull_get_refuses_bad_queue_and_dead_letter() -> None:
    # ListenerPolicy is what get() builds for a queue; its checks are the ones get() gets
    refused(lambda: ListenerPolicy(name="pull:q", queue="", prefetch=0), "queue")
    refused(lambda: ListenerPolicy(name="pull:q", queue="q", dead_letter=""), "dead_letter")
    refused(lambda: ListenerPolicy(name="pull:q", queue="q", dead_letter="q"), "dead_letter")


# -- handler binding ----------------------------------------------------------------


class Order(BaseModel):
    id: int


def h_plain(msg):  # type: ignore[no-untyped-def]
    pass


def h_delivery(d: Delivery) -> None: ...
def h_async_delivery(d: AsyncDelivery) -> None: ...
def h_model(o: Order) -> None: ...
def h_model_d(o: Order, d: Delivery) -> None: ...
def h_model_plain_second(o: Order, msg) -> None: ...  # type: ignore[no-untyped-def]
def h_model_optional(o: Order, extra: int = 3) -> None: ...
def h_dict(body: dict) -> None: ...  # type: ignore[type-arg]
def h_dict_typed(body: dict[str, int]) -> None: ...
def h_list_json(body: list) -> None: ...  # type: ignore[type-arg]
def h_any(body: Any) -> None: ...
def h_bytes(body: bytes) -> None: ...
def h_str(body: str) -> None: ...
def h_int(body: int) -> None: ...
def h_none() -> None: ...
def h_batch_models(orders: list[Order]) -> None: ...
def h_batch_plain(ds: list) -> None: ...  # type: ignore[type-arg]
def h_batch_d(ds: list[Delivery]) -> None: ...
def h_batch_seq(bodies: Sequence[bytes], ds: list[Delivery]) -> None: ...
def h_varargs(*args) -> None: ...  # type: ignore[no-untyped-def]
def h_delivery_twice(d: Delivery, again: Delivery) -> None: ...


async def a_plain(msg):  # type: ignore[no-untyped-def]
    pass


class AsyncCallable:
    async def __call__(self, order: Order) -> None: ...


class SyncCallable:
    def __call__(self, body: bytes, d: Delivery) -> None: ...


BINDING_TABLE: list[tuple[Callable[..., Any], str, bool, bool, bool]] = [
    # handler, kind of the first argument, batch, second gets the Delivery, async
    (h_plain, "delivery", False, False, False),
    (h_delivery, "delivery", False, False, False),
    (h_async_delivery, "delivery", False, False, False),
    (h_model, "model", False, False, False),
    (h_model_d, "model", False, True, False),
    (h_model_plain_second, "model", False, True, False),
    (h_model_optional, "model", False, False, False),
    (h_dict, "json", False, False, False),
    (h_dict_typed, "adapter", False, False, False),
    (h_list_json, "json", False, False, False),
    (h_any, "json", False, False, False),
    (h_bytes, "bytes", False, False, False),
    (h_str, "text", False, False, False),
    (h_int, "adapter", False, False, False),
    (h_none, "none", False, False, False),
    (h_batch_models, "model", True, False, False),
    (h_batch_plain, "json", False, False, False),  # bare list: a JSON array
    (h_batch_d, "delivery", True, False, False),
    (h_batch_seq, "bytes", True, True, False),
    (h_varargs, "delivery", False, False, False),
    (h_delivery_twice, "delivery", False, True, False),
    (lambda d: None, "delivery", False, False, False),
    (a_plain, "delivery", False, False, True),
    (functools.partial(a_plain), "delivery", False, False, True),
    (AsyncCallable(), "model", False, False, True),
    (functools.partial(AsyncCallable()), "model", False, False, True),
    (SyncCallable(), "bytes", False, True, False),
    (functools.partial(h_model_d), "model", False, True, False),
]


@pytest.mark.parametrize(
    "fn,kind,batch,second,is_async", BINDING_TABLE, ids=[repr(r[0])[:40] for r in BINDING_TABLE]
)
def test_binding_table(
    fn: Callable[..., Any], kind: str, batch: bool, second: bool, is_async: bool
) -> None:
    b = Binding(fn, Decoder())
    assert (b.kind, b.batch, b.pass_delivery, b.is_async) == (kind, batch, second, is_async)
    assert is_coroutine_callable(fn) is is_async


def bad_second(body: dict, n: int) -> None: ...  # type: ignore[type-arg]
def bad_third(body: dict, d: Delivery, n) -> None: ...  # type: ignore[no-untyped-def, type-arg]
def bad_kwonly(body: dict, *, n: int) -> None: ...  # type: ignore[type-arg]


@pytest.mark.parametrize(
    "fn,says",
    [
        (bad_second, "second parameter 'n'"),
        (bad_third, "parameter 'n' would receive nothing"),
        (bad_kwonly, "keyword-only parameter 'n'"),
        (42, "must be callable"),
        ("handler", "must be callable"),
        (None, "must be callable"),
    ],
)
def test_bindings_that_cannot_be_called_are_refused(fn: Any, says: str) -> None:
    refused(lambda: register(fn=fn), says)


@pytest.mark.parametrize(
    "fn", [a_plain, functools.partial(a_plain), AsyncCallable(), functools.partial(AsyncCallable())]
)
def test_the_sync_app_refuses_coroutine_handlers(fn: Any) -> None:
    app = App()
    refused(lambda: app.listener("q")(fn), "AsyncApp")
    assert app.specs == []
    AsyncApp().listener("q")(fn)  # where it belongs


@pytest.mark.parametrize("mode", [AckMode.MANUAL, AckMode.CLIENT, AckMode.INDIVIDUAL])
@pytest.mark.parametrize("fn", [h_model, h_dict, h_bytes, h_none, h_batch_models])
def test_modes_that_need_the_handler_to_settle_need_its_delivery(mode: AckMode, fn: Any) -> None:
    kw: dict[str, Any] = {"batch_size": 10} if fn is h_batch_models else {}
    err = refused(lambda: register(fn=fn, ack_mode=mode, **kw), "Delivery")
    assert str(mode) in str(err)


@pytest.mark.parametrize("mode", [AckMode.MANUAL, AckMode.CLIENT, AckMode.INDIVIDUAL])
@pytest.mark.parametrize("fn", [h_plain, h_delivery, h_model_d, h_model_plain_second])
def test_handlers_that_get_their_delivery_may_settle(mode: AckMode, fn: Any) -> None:
    register(fn=fn, ack_mode=mode)


@pytest.mark.parametrize("mode", [AckMode.AUTO, AckMode.DUPS_OK, AckMode.TRANSACTED])
def test_auto_modes_take_any_handler(mode: AckMode) -> None:
    register(fn=h_model, ack_mode=mode)
    register(fn=h_none, ack_mode=mode)


# -- decoding: every body that cannot be decoded is a BadPayload -------------------------


class _Settler:
    def settle(self, *a: Any) -> None:
        pass


def delivery(body: bytes, content_type: str | None = "application/json") -> Delivery:
    class Props:
        headers: dict[str, Any] = {}
        content_encoding = None

    Props.content_type = content_type  # type: ignore[attr-defined]
    core = ListenerCore(ListenerPolicy(name="t", queue="t"))
    core.channel_opened()
    return Delivery(body, Props(), core.receive(1), _Settler(), queue="t")


class Deep(BaseModel):
    a: Any


def h_deep(m: Deep) -> None: ...


DECODERS = [h_dict, h_any, h_list_json, h_model, h_deep, h_int, h_dict_typed]


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("fn", DECODERS)
@pytest.mark.parametrize("depth", [10_000, 100_000, 1_000_000])
def test_deep_nesting_is_a_bad_payload(fn: Any, depth: int) -> None:
    b = Binding(fn, Decoder())
    for body in (nested(depth), b'{"a":' + nested(depth) + b"}"):
        with pytest.raises(BadPayload):
            b.args(delivery(body))
    d = delivery(b'{"a":' + nested(depth) + b"}")
    with pytest.raises(BadPayload):
        d.json()
    with pytest.raises(BadPayload):
        d.model(Deep)


HOSTILE = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"\xef\xbb\xbf{}",
            b"\xff\xfe{\x00}\x00",
            b"[NaN, Infinity, -Infinity]",
            b"NaN",
            b"1" * 5000,
            b"1e999999",
            b'{"id": 1' + b"0" * 5000 + b"}",
            b'{"id": "\\ud800"}',
            b'"\xed\xa0\x80"',
            b"\x00",
            b"{" * 3000,
            b'{"a":' * 3000,
            nested(3000),
            b"",
        ]
    ),
)


@SETTINGS
@given(body=HOSTILE, fn=st.sampled_from([*DECODERS, h_str, h_bytes]))
def test_any_body_decodes_or_is_a_bad_payload(body: bytes, fn: Any) -> None:
    b = Binding(fn, Decoder())
    try:
        b.args(delivery(body))
    except BadPayload as exc:
        assert str(exc)
    d = delivery(body)
    for decode in (d.json, lambda: d.model(Order), d.text):
        with contextlib.suppress(BadPayload):
            decode()


def test_json_values_python_accepts_stay_accepted() -> None:
    b = Binding(h_any, Decoder())
    (v,) = b.args(delivery(b"[NaN, 1]"))
    assert math.isnan(v[0]) and v[1] == 1
    assert Binding(h_dict, Decoder()).args(delivery(b'{"a": 1}')) == ({"a": 1},)
    assert json.loads(b"\xef\xbb\xbf{}") == {}


def test_an_unannotated_handler_gets_the_delivery_of_any_body() -> None:
    b = Binding(h_plain, Decoder())
    for body in (b"hello-0", b"", b"\xff\xfe", b"{not json"):
        d = delivery(body, content_type="text/plain")
        assert b.args(d) == (d,)


@pytest.mark.parametrize(
    "fn,body,ok",
    [
        (h_dict, b"[1, 2]", False),
        (h_dict, b'"text"', False),
        (h_dict_typed, b'{"a": 1}', True),
        (h_dict, b'{"a": 1}', True),
        (h_list_json, b'{"a": 1}', False),
        (h_list_json, b"[1]", True),
        (h_any, b"[1]", True),
        (h_any, b"null", True),
    ],
)
def test_a_container_handler_gets_that_container_or_a_bad_payload(
    fn: Any, body: bytes, ok: bool
) -> None:
    b = Binding(fn, Decoder())
    if ok:
        assert b.args(delivery(body)) == (json.loads(body),)
    else:
        with pytest.raises(BadPayload, match="the handler takes a"):
            b.args(delivery(body))


def test_a_parametrised_container_is_validated_by_pydantic() -> None:
    b = Binding(h_dict_typed, Decoder())
    with pytest.raises(BadPayload, match="does not match"):
        b.args(delivery(b'{"a": "not an int"}'))
    with pytest.raises(BadPayload, match="does not match"):
        b.args(delivery(b"[1]"))
