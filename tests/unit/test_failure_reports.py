"""How a handler failure is reported: the traceback text (formatted only for dead
letters, once per place and error, the chain kept) and the throttled failure log."""

from __future__ import annotations

import pytest

from ackkit import Retry
from ackkit._core import headers as H
from tests.unit._fakes import core


def _raise_at_one_place(n: int) -> BaseException:
    try:
        raise ValueError(f"poison {n % 2}")
    except ValueError as exc:
        return exc


def test_dead_letter_formats_the_traceback_from_the_exception() -> None:
    c = core()
    t = c.receive(1)
    (act,) = c.finish(t, _raise_at_one_place(0))  # no traceback text passed
    tb = act.set_headers[H.ERROR_TRACEBACK]  # type: ignore[union-attr]
    assert tb.startswith("Traceback (most recent call last):")
    assert "_raise_at_one_place" in tb and tb.rstrip().endswith("ValueError: poison 0")


def test_retry_does_not_format_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    import ackkit._core.copies as L

    calls: list[BaseException] = []
    monkeypatch.setattr(L, "format_traceback", lambda e: calls.append(e) or "tb")
    c = core(retry=Retry(max_attempts=2))
    t = c.receive(1)
    (act,) = c.finish(t, _raise_at_one_place(0))
    assert act.purpose == "retry" and calls == []  # type: ignore[union-attr]
    t = c.receive(2, headers={H.ATTEMPT: 2})
    c.finish(t, _raise_at_one_place(0))
    assert len(calls) == 1


def test_format_traceback_is_the_standard_text_and_cached() -> None:
    import traceback

    from ackkit._core.tb import _CACHE, format_traceback

    a, b, other = _raise_at_one_place(0), _raise_at_one_place(0), _raise_at_one_place(1)
    text = format_traceback(a)
    assert text == "".join(traceback.format_exception(type(a), a, a.__traceback__))
    assert format_traceback(b) is text  # same place, same error: formatted once
    assert format_traceback(other) != text and "poison 1" in format_traceback(other)
    assert len(_CACHE) <= 256


def test_format_traceback_keeps_the_chain() -> None:
    from ackkit._core.tb import format_traceback

    try:
        try:
            raise KeyError("inner")
        except KeyError as e:
            raise RuntimeError("outer") from e
    except RuntimeError as exc:
        text = format_traceback(exc)
    assert "KeyError: 'inner'" in text and "direct cause" in text and "RuntimeError: outer" in text


class _Stop(BaseException):
    pass


class _StrRaisesBase(Exception):
    """An exception whose str() raises something outside the Exception tree."""

    def __init__(self, raised: type[BaseException]) -> None:
        super().__init__()
        self.raised = raised

    def __str__(self) -> str:
        raise self.raised()


@pytest.mark.parametrize("raised", [_Stop, KeyboardInterrupt, SystemExit])
def test_a_dead_letter_is_made_when_str_of_the_error_raises_a_base_exception(
    raised: type[BaseException],
) -> None:
    """format_traceback keyed its cache on str(exc) and let a BaseException from a hostile
    __str__ escape: the dead letter was never made and the consumer's worker died."""
    c = core()
    t = c.receive(1)
    try:
        try:
            raise KeyError("inner")
        except KeyError as e:
            raise _StrRaisesBase(raised) from e
    except _StrRaisesBase as exc:
        (act,) = c.finish(t, exc)
    hdrs = act.set_headers  # type: ignore[union-attr]
    assert act.purpose == "dead-letter"  # type: ignore[union-attr]
    assert hdrs[H.ERROR_MESSAGE] == "<_StrRaisesBase: str() failed>"
    assert hdrs[H.ERROR_TRACEBACK].startswith("Traceback (most recent call last):")
    assert "_StrRaisesBase" in hdrs[H.ERROR_TRACEBACK]


def test_failure_log_is_throttled_and_counts_what_it_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging

    from ackkit._telemetry.logs import FailureLog

    now = [0.0]
    flog = FailureLog(logging.getLogger("ackkit.test"), burst=3, window=1.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="ackkit.test"):
        for _ in range(10):
            flog.failed("l", "<d>", ValueError("x"))
        now[0] = 1.5
        flog.failed("l", "<d>", ValueError("x"))
    lines = [r.getMessage() for r in caplog.records]
    # the first failure of its kind with its traceback (outside the throttle), then
    # `burst` plain lines, then one that counts what the window left out
    assert len(lines) == 5
    assert lines[0].startswith("l: handler failed on '<d>': ValueError: x\n")
    assert all("\n" not in line for line in lines[1:])
    assert lines[1] == "l: handler failed on '<d>': ValueError: x"
    assert lines[4].endswith("(6 more failures not logged)")
