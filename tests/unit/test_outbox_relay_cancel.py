"""The async outbox relay under cancellation, without a database or a broker: the
DELETE of what the broker confirmed runs to its end, then the cancel is raised; a
stopping relay takes no batch after the one it is sending."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ackkit._messages.publish import Outgoing
from ackkit.inbox._outbox import arelay_once, to_the_end


class FakeConn:
    """An AsyncConnection answering the relay's statements; the DELETE takes `hold` s."""

    def __init__(self, rows: list[tuple[Any, ...]], hold: float = 0.0) -> None:
        self.rows = rows
        self.hold = hold
        self.deleted: list[int] = []
        self.unlocked = False

    async def execute(self, sql: str, params: Any = ()) -> Any:
        conn = self

        class Cur:
            def __init__(self, result: list[tuple[Any, ...]]) -> None:
                self.result = result

            async def fetchone(self) -> tuple[Any, ...]:
                return self.result[0]

            async def fetchall(self) -> list[tuple[Any, ...]]:
                return self.result

        if "pg_try_advisory_lock" in sql:
            return Cur([(True,)])
        if "pg_advisory_unlock" in sql:
            conn.unlocked = True
            return Cur([(True,)])
        if sql.startswith("SELECT"):
            left = [r for r in conn.rows if r[0] not in conn.deleted]
            return Cur(left[: params[0]])
        if sql.startswith("DELETE"):
            await asyncio.sleep(conn.hold)
            conn.deleted.extend(params[0])
            return Cur([])
        raise AssertionError(sql)


def rows(n: int) -> list[tuple[Any, ...]]:
    return [(i, "", "q", b"x", "{}") for i in range(1, n + 1)]


def test_a_cancel_during_the_delete_waits_for_it_then_is_raised() -> None:
    async def main() -> FakeConn:
        conn = FakeConn(rows(3), hold=0.2)
        sent: list[Outgoing] = []

        async def publish(msg: Outgoing) -> None:
            sent.append(msg)

        task = asyncio.ensure_future(arelay_once(conn, "ackkit_outbox", publish))
        while not sent or len(sent) < 3:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # in the DELETE
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return conn

    conn = asyncio.run(main())
    assert conn.deleted == [1, 2, 3]
    assert conn.unlocked


def test_to_the_end_returns_its_result_when_nobody_cancels() -> None:
    async def seven() -> int:
        await asyncio.sleep(0)
        return 7

    assert asyncio.run(to_the_end(seven())) == 7


def test_a_stopping_relay_takes_no_batch_after_the_one_it_sends() -> None:
    from ackkit.inbox import _outbox

    async def main() -> tuple[FakeConn, int]:
        conn = FakeConn(rows(_outbox.BATCH + 5))
        stopping = [False]

        async def publish(msg: Outgoing) -> None:
            stopping[0] = True  # the stop comes while the first batch is sent

        n = await arelay_once(conn, "ackkit_outbox", publish, lambda: stopping[0])
        return conn, n

    conn, n = asyncio.run(main())
    assert n == _outbox.BATCH
    assert conn.deleted == list(range(1, _outbox.BATCH + 1))
