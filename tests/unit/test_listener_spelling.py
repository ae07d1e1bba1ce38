"""listener()'s flat options of 0.1 (deprecated): each warns, naming its new spelling,
at the decorator's line, and builds the same listener as the grouped values."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ackkit import App, Consumer, Delivery, FlushPolicy, Queue
from ackkit._app.listener_options import DEPRECATED, new_spelling
from ackkit._app.listener_spec import ListenerSpec
from ackkit.flow import CircuitBreaker, RateLimit, SerialKey
from tests.unit.test_config import OPTION_CASES, grouped, refused


def one(d: Delivery) -> None:
    pass


def many(ds: list[Delivery]) -> None:
    pass


OLD = st.fixed_dictionaries(
    {},
    optional={
        "prefetch": st.integers(0, 65535),
        "concurrency": st.integers(1, 64),
        "max_concurrency": st.integers(1, 64),
        "exclusive": st.booleans(),
        "consumer_priority": st.integers(-10, 10),
        "consumer_timeout": st.floats(0.5, 3600),
        "consumer_arguments": st.sampled_from([{}, {"x-custom": "v"}]),
        "flush": st.sampled_from([None, FlushPolicy(max_pending=5, interval=0.5)]),
        "max_body_size": st.integers(1, 2**30),
        "check_content_type": st.booleans(),
        "declare": st.booleans(),
        "queue_arguments": st.sampled_from([{}, {"x-queue-type": "quorum"}, {"x-max-length": 100}]),
        "bind": st.sampled_from([None, ("orders", "order.*"), [("a", "x"), ("b", "y")]]),
        "batch_size": st.integers(1, 500),
        "batch_timeout": st.floats(0, 10),
        "circuit_breaker": st.sampled_from([None, CircuitBreaker()]),
        "rate_limit": st.sampled_from([None, 12.5, RateLimit(3, burst=2)]),
        "serial_key": st.sampled_from([None, SerialKey.header("k")]),
    },
)


def comparable(spec: ListenerSpec) -> dict[str, Any]:
    out = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    b = out.pop("binding")
    out["handler"] = (b.fn, b.batch, b.decoder.max_body_size, b.decoder.check_content_type)
    return out


@settings(max_examples=200, deadline=None)
@given(kw=OLD)
def test_old_and_new_spellings_build_the_same_listener(kw: dict[str, Any]) -> None:
    assume(kw)
    if "batch_size" in kw and kw.get("serial_key") is not None:
        kw.pop("serial_key")
    if "batch_size" in kw and kw.get("prefetch") and kw["batch_size"] > kw["prefetch"]:
        kw["prefetch"] = kw["batch_size"]
    fn = many if "batch_size" in kw else one
    old, new = App(), App()
    with pytest.warns(DeprecationWarning) as caught:
        old.listener("orders", **kw)(fn)
    assert {str(w.message).split("(")[1].split("=")[0] for w in caught} == set(kw)
    queue, nkw = grouped("orders", kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new.listener(queue, **nkw)(fn)
    assert old.specs[0].policy == new.specs[0].policy
    assert comparable(old.specs[0]) == comparable(new.specs[0])


@pytest.mark.parametrize("option", sorted(DEPRECATED))
def test_each_old_option_warns_at_the_decorator_line_naming_the_new_spelling(
    option: str,
) -> None:
    values: dict[str, Any] = {
        "bind": ("ex", "rk"),
        "circuit_breaker": CircuitBreaker(),
        "rate_limit": 5.0,
        "serial_key": SerialKey.header("k"),
        "queue_arguments": {"x-max-length": 5},
        "consumer_arguments": {"x-custom": 1},
        "flush": FlushPolicy(max_pending=2, interval=0.1),
        "batch_size": 5,
        "batch_timeout": 0.5,
        "consumer_timeout": 60,
        "consumer_priority": 1,
    }
    value = values.get(option, {"declare": True, "exclusive": True}.get(option, 10))
    if option == "check_content_type":
        value = False
    app = App()
    with pytest.warns(DeprecationWarning) as caught:
        line = _line() + 1
        app.listener("orders", **{option: value})
    (w,) = caught
    assert w.filename == __file__ and w.lineno == line
    assert new_spelling(option) in str(w.message)
    group, name = DEPRECATED[option]
    assert f"{name}=" in str(w.message) and ("Queue(" if group == "queue" else f"{group}=") in (
        str(w.message)
    )


def _line() -> int:
    import inspect

    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno


@pytest.mark.parametrize("kw,option", OPTION_CASES)
def test_bad_old_options_still_fail_at_once(kw: dict[str, Any], option: str) -> None:
    app = App()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        refused(lambda: app.listener("orders", **kw)(one), option)
    assert app.specs == []


def test_old_and_new_spellings_of_one_group_together_are_refused() -> None:
    app = App()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(TypeError, match="prefetch= and consumer= both given"):
            app.listener("q", consumer=Consumer(), prefetch=5)
        with pytest.raises(TypeError, match="declare= and queue= both given"):
            app.listener(Queue("q"), declare=False)
    with pytest.raises(TypeError, match="unexpected keyword argument 'prefetc'"):
        app.listener("q", prefetc=5)


def test_max_concurrency_wins_over_concurrency_as_before() -> None:
    app = App()
    with pytest.warns(DeprecationWarning):
        app.listener("q", concurrency=2, max_concurrency=7)(one)
    assert app.specs[0].concurrency == 7
