"""The inbox's decisions (ackkit._core.inbox) and its options, with generated inputs."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ackkit import Batch
from ackkit._core.inbox import (
    BYTES_MARK,
    DOWN_STATES,
    MAX_KEY_BYTES,
    MAX_KEY_LENGTH,
    PROBE,
    TRANSACTION_RETRY,
    TRANSIENT_STATES,
    Backoff,
    Fault,
    KeyVerdict,
    MissingKey,
    UnusableKey,
    fault_of,
    key_verdict,
    normalize_key,
    probe_delay,
)
from ackkit.inbox import Inbox, schema

keys = st.one_of(st.none(), st.text(max_size=MAX_KEY_LENGTH + 20))
states = st.one_of(
    st.none(),
    st.sampled_from(sorted(TRANSIENT_STATES | DOWN_STATES)),
    st.text(alphabet="0123456789ABCDEFP", min_size=5, max_size=5),
)


@settings(max_examples=300)
@given(key=keys, missing=st.sampled_from(MissingKey))
def test_a_key_is_guarded_or_the_message_never_runs_unguarded_by_default(
    key: str | None, missing: MissingKey
) -> None:
    verdict, why = key_verdict(key, missing)
    if key is not None and len(key) <= MAX_KEY_LENGTH:
        assert verdict is KeyVerdict.GUARDED and why == ""
    elif key is None and missing is MissingKey.RUN:
        assert verdict is KeyVerdict.UNGUARDED
    else:  # never silently run without dedup: dead-lettered, and says why
        assert verdict is KeyVerdict.DEAD_LETTER and why


key_values = st.one_of(
    st.none(),
    st.text(max_size=40),
    st.text(alphabet="ab\x00\ufffe-", max_size=6),  # NUL and the mark: the hostile ones
    st.binary(max_size=40),
    st.binary(max_size=6).map(bytearray),
    st.integers(),
)


def meaning(value: object) -> object:
    """What a key value denotes: an int is its decimal text; bytes that are UTF-8 text
    without NUL (and without the mark) are that text; other bytes are themselves."""
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        try:
            text = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(value)
        return bytes(value) if "\x00" in text or text.startswith(BYTES_MARK) else text
    return value


def stored(value: object) -> str | None:
    try:
        return normalize_key(value)
    except UnusableKey as exc:
        assert str(exc)  # a reason to dead-letter with
        return None


@settings(max_examples=500)
@given(a=key_values, b=key_values)
@example(a=b"\xff-x", b=b"\xfe-x")  # both decoded to "\ufffd-x" once: the second skipped
@example(a=bytearray(b"\xff-x"), b=b"\xff-x")
@example(a=b"\x00", b="\x00")
@example(a=BYTES_MARK + "ff", b=b"\xff")
def test_two_keys_are_stored_alike_only_when_they_are_the_same_key(a: object, b: object) -> None:
    ka, kb = stored(a), stored(b)
    if ka is not None and kb is not None:
        assert (ka == kb) == (meaning(a) == meaning(b)), (ka, kb)
        for k in (ka, kb):
            assert isinstance(k, str) and 0 < len(k) <= MAX_KEY_LENGTH
            assert "\x00" not in k  # PostgreSQL text holds it
            k.encode("utf-8")


@given(value=st.one_of(st.none(), st.text(), st.binary(), st.integers()))
def test_normalize_key_gives_text_or_none_and_equal_inputs_equal_keys(value: object) -> None:
    try:
        k = normalize_key(value)
    except UnusableKey:
        assert isinstance(value, str) and ("\x00" in value or len(value) > MAX_KEY_LENGTH)
        return
    assert k is None or (isinstance(k, str) and k)
    if isinstance(value, str):
        assert k == (value or None)
        assert normalize_key(value.encode()) == k  # bytes and text: the same key
        assert normalize_key(bytearray(value.encode())) == k  # aio-pika's byte-array


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("a\x00b", "NUL"),
        ("\ud800", "surrogate"),
        (BYTES_MARK + "x", r"U\+FFFE"),
        ("x" * (MAX_KEY_LENGTH + 1), "longer than 512"),
        (b"\xff" * (MAX_KEY_BYTES + 1), f"longer than {MAX_KEY_BYTES} bytes"),
    ],
)
def test_a_key_that_cannot_be_stored_as_given_is_refused_with_its_reason(
    value: object, why: str
) -> None:
    with pytest.raises(UnusableKey, match=why):
        normalize_key(value)


def test_bytes_with_nul_or_not_utf8_are_kept_whole() -> None:
    assert normalize_key(b"a\x00b") == BYTES_MARK + "610062"
    assert normalize_key(b"\xff" * MAX_KEY_BYTES) == BYTES_MARK + "ff" * MAX_KEY_BYTES


@pytest.mark.parametrize("value", [True, 1.5, {"a": 1}, [1]])
def test_normalize_key_refuses_what_is_no_key(value: object) -> None:
    with pytest.raises(TypeError):
        normalize_key(value)


@settings(max_examples=300)
@given(state=states, lost=st.booleans(), connecting=st.booleans())
def test_fault_rules(state: str | None, lost: bool, connecting: bool) -> None:
    f = fault_of(state, connection_lost=lost, connecting=connecting)
    if connecting:
        assert f is Fault.DOWN  # no connection: never a handler failure, never an attempt
    elif state in TRANSIENT_STATES:
        assert f is Fault.TRANSIENT
    elif lost:
        assert f is Fault.TRANSIENT  # the commit's fate unknown: the retry finds the key
    elif state is not None and (state in DOWN_STATES or state.startswith("08")):
        assert f is Fault.DOWN
    else:
        assert f is Fault.HANDLER


@given(
    first=st.floats(0, 10), cap=st.floats(0, 100), tries=st.integers(1, 50), done=st.integers(0, 60)
)
def test_backoff_is_bounded_monotone_and_ends(
    first: float, cap: float, tries: int, done: int
) -> None:
    b = Backoff(first, cap, tries)
    d = b.delay(done)
    if done >= tries:
        assert d is None
    else:
        assert d is not None and 0 <= d <= max(cap, 0)
        nxt = b.delay(done + 1)
        assert nxt is None or nxt >= d or nxt == cap


def test_transaction_retries_are_short_and_end() -> None:
    waits = [TRANSACTION_RETRY.delay(i) for i in range(TRANSACTION_RETRY.tries)]
    assert all(w is not None for w in waits)
    assert sum(w or 0 for w in waits) < 5  # well inside any consumer timeout
    assert TRANSACTION_RETRY.delay(TRANSACTION_RETRY.tries) is None


@given(st.integers(0, 10_000))
def test_probes_go_on_for_ever_at_most_cap_apart(n: int) -> None:
    assert PROBE.first <= probe_delay(n) <= PROBE.cap


@pytest.mark.parametrize(
    ("kw", "err"),
    [
        ({"dsn": ""}, ValueError),
        ({"dsn": 5}, TypeError),
        ({"dsn": "memory://"}, ValueError),
        ({"dsn": "x", "key": "message_id"}, TypeError),
        ({"dsn": "x", "retention": 0}, ValueError),
        ({"dsn": "x", "retention": float("inf")}, ValueError),
        ({"dsn": "x", "retention_batch": 0}, ValueError),
        ({"dsn": "x", "table": "inbox; drop table x"}, ValueError),
        ({"dsn": "x", "table": "a", "outbox_table": "a"}, ValueError),
        ({"dsn": "x", "missing_key": "sometimes"}, ValueError),
        ({"dsn": "x", "connect_timeout": 0}, ValueError),
    ],
)
def test_bad_options_fail_at_once(kw: dict[str, object], err: type[Exception]) -> None:
    with pytest.raises(err):
        Inbox(**kw)  # type: ignore[arg-type]


def test_repr_masks_the_password() -> None:
    assert "s3cret" not in repr(Inbox("postgresql://app:s3cret@db/shop"))
    assert "s3cret" not in repr(Inbox("host=db user=app password=s3cret"))


def test_schema_names_the_tables() -> None:
    sql = schema("app.inbox", "app.outbox")
    assert "CREATE TABLE IF NOT EXISTS app.inbox" in sql
    assert "CREATE INDEX IF NOT EXISTS inbox_received_at ON app.inbox" in sql
    assert "PRIMARY KEY (listener, key)" in sql


def test_listener_refuses_inbox_with_what_breaks_it() -> None:
    from ackkit import AckMode, App

    app = App()
    with pytest.raises(ValueError, match="AUTO"):
        app.listener("q", inbox=Inbox("memory://x"), ack_mode=AckMode.MANUAL)
    app.listener("q", inbox=Inbox("memory://x"), batch=Batch(10))  # one transaction a batch
    with pytest.raises(TypeError, match="Inbox"):
        app.listener("q", inbox="postgresql://x")  # type: ignore[arg-type]


def test_async_app_refuses_a_def_handler_with_an_inbox() -> None:
    from ackkit import AsyncApp

    app = AsyncApp()
    with pytest.raises(TypeError, match="async def"):

        @app.listener("q", inbox=Inbox("memory://x"))
        def handle(body: bytes) -> None: ...
