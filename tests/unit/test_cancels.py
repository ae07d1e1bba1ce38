"""AsyncApp tells its own cancellations from a handler's own CancelledError without
Task.cancelling() (Python 3.10 has none): tested here with that API hidden, as on 3.10."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ackkit._async import cancels


@pytest.fixture(params=["3.10", "3.11+"])
def python(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "3.10":
        monkeypatch.setattr(cancels, "_task_cancelling", None)
    return str(request.param)


async def _verdict(body: Any, cancel_it: bool, stopping: bool = False) -> bool:
    verdict: list[bool] = []

    async def handler() -> None:
        try:
            await body()
        except asyncio.CancelledError:
            verdict.append(cancels.cancelled_from_outside(asyncio.current_task(), stopping))
            raise

    task = asyncio.get_running_loop().create_task(handler())
    await asyncio.sleep(0.01)
    if cancel_it:
        cancels.cancel(task)
    with pytest.raises(asyncio.CancelledError):
        await task
    return verdict[0]


async def _hang() -> None:
    await asyncio.sleep(60)


async def _raise_own() -> None:
    await asyncio.sleep(0)
    raise asyncio.CancelledError("an inner task was cancelled")


async def _await_cancelled_inner() -> None:
    inner = asyncio.get_running_loop().create_task(_hang())
    await asyncio.sleep(0)
    inner.cancel()  # someone else's task, cancelled; awaiting it raises CancelledError
    await inner


def test_ackkits_own_cancellation_is_a_release(python: str) -> None:
    assert asyncio.run(_verdict(_hang, cancel_it=True)) is True


@pytest.mark.parametrize("body", [_raise_own, _await_cancelled_inner])
def test_a_handlers_own_cancelled_error_is_a_failure(python: str, body: Any) -> None:
    assert asyncio.run(_verdict(body, cancel_it=False)) is False


def test_a_stopping_runtime_takes_any_cancellation_for_its_own(python: str) -> None:
    assert asyncio.run(_verdict(_raise_own, cancel_it=False, stopping=True)) is True


def test_someone_elses_cancellation_is_known_only_with_task_cancelling(python: str) -> None:
    """asyncio.run's teardown or a caller's task.cancel(): 3.11+ sees it; 3.10 cannot
    (it is taken for the handler's own, see the module's docstring)."""

    async def main() -> bool:
        verdict: list[bool] = []

        async def handler() -> None:
            try:
                await _hang()
            except asyncio.CancelledError:
                verdict.append(cancels.cancelled_from_outside(asyncio.current_task()))
                raise

        task = asyncio.get_running_loop().create_task(handler())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return verdict[0]

    assert asyncio.run(main()) is (python == "3.11+")
