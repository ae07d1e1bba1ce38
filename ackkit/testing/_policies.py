"""Policies on the test's broker: what an operator sets with ``rabbitmqctl set_policy``.

A real node of the kit's own (or its container) gets them through erl_call, an Erlang
expression evaluated on the node (milliseconds, where each ``rabbitmqctl`` run boots an
Erlang VM: most of a second of CPU); any other broker the kit reaches through
``rabbitmqctl``. The in-memory broker applies them itself (`_mem_topology`), with
RabbitMQ's rules for combining a policy with the queue's own arguments.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from typing import Any

from ._errors import BrokerError
from ._queries import _erl_binary

APPLY_TO = ("queues", "classic_queues", "quorum_queues", "all")
"""What a queue policy may apply to (``--apply-to``; 3.x knows "queues" and "all")."""


def check_policy(name: str, pattern: str, definition: Mapping[str, Any], apply_to: str) -> None:
    """A clear error at once for a policy RabbitMQ would refuse or ackkit cannot apply."""
    if not name:
        raise ValueError("a policy needs a name")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(
            f"policy {name!r}: pattern {pattern!r} is no regular expression: {exc}"
        ) from None
    if apply_to not in APPLY_TO:
        raise ValueError(f"policy {name!r}: apply_to must be one of {', '.join(APPLY_TO)}")
    if not definition:
        raise ValueError(f"policy {name!r}: an empty definition")
    for key in definition:
        if key.startswith("x-"):
            raise ValueError(
                f"policy {name!r}: {key!r} is a queue argument; a policy says {key[2:]!r}"
            )


_ACTOR = _erl_binary("ackkit-test-kit")  # the acting user the broker records
# "OK;ok", or "OK;!" and the node's reason for R in hex (as rabbitmqctl would print it)
_ANSWER = (
    'case R of ok -> "OK;ok"; _ -> T = case R of {error_string, S} -> S; '
    '{error, F, A} -> io_lib:format(F, A); _ -> io_lib:format("~p", [R]) end, '
    'lists:flatten(["OK;!" | [io_lib:format("~2.16.0b", [B]) || '
    "<<B>> <= unicode:characters_to_binary(T)]]) end."
)


def _set_policy_expr(
    vhost: str, name: str, pattern: str, definition: str, priority: int, apply_to: str
) -> str:
    """What ``rabbitmqctl set_policy`` calls (the definition as JSON): `_ANSWER`."""
    args = ", ".join(
        _erl_binary(a) for a in (vhost, name, pattern, definition, str(priority), apply_to)
    )
    return f"R = rabbit_policy:parse_set({args}, {_ACTOR}), {_ANSWER}"


def _clear_policy_expr(vhost: str, name: str) -> str:
    """What ``rabbitmqctl clear_policy`` calls: `_ANSWER`."""
    expr = f"rabbit_policy:delete({_erl_binary(vhost)}, {_erl_binary(name)}, {_ACTOR})"
    return f"R = {expr}, {_ANSWER}"


def _policy_name_expr(vhost: str, queue: str) -> str:
    """The name of the policy that applies to ``queue``: "OK;=" and the name in hex
    ("OK;=" alone for none), "OK;missing" for no such queue."""
    queue_ref = f"rabbit_misc:r({_erl_binary(vhost)}, queue, {_erl_binary(queue)})"
    return (
        f"R = case rabbit_amqqueue:lookup({queue_ref}) of {{ok, Q}} -> "
        'case rabbit_policy:name(Q) of none -> "="; N -> ["=" | '
        '[io_lib:format("~2.16.0b", [B]) || <<B>> <= N]] end; '
        '_ -> "missing" end, lists:flatten(["OK;", R]).'
    )


def _reason(answer: str) -> str:
    """The node's reason in an `_ANSWER` that is not "ok", on one line."""
    try:
        text = bytes.fromhex(answer.removeprefix("!")).decode("utf-8", "replace")
    except ValueError:
        text = answer
    return " ".join(text.split())


class PolicyControl:
    """``set_policy`` / ``clear_policy`` / ``policy_of`` of a broker handle: through
    erl_call on a node of the kit's own, else rabbitmqctl; the in-memory broker puts,
    drops and reads policies itself."""

    vhost: str

    def ctl(self, *args: str, timeout: float = 60.0) -> str:  # pragma: no cover - the handle's
        raise NotImplementedError

    def _erl_eval(self, expr: str) -> str | None:  # pragma: no cover - the handle's
        raise NotImplementedError

    def set_policy(
        self,
        name: str,
        pattern: str,
        definition: Mapping[str, Any],
        *,
        apply_to: str = "queues",
        priority: int = 0,
        wait_for: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        """Set the policy ``name`` on the queues whose names match ``pattern`` (a regular
        expression), e.g. ``{"max-length": 1, "overflow": "reject-publish"}``. A real
        broker applies it shortly after: ``wait_for`` names a queue to wait for until it
        shows the policy (the in-memory broker applies it at once)."""
        check_policy(name, pattern, definition, apply_to)
        self._put_policy(name, pattern, definition, apply_to, priority)
        if wait_for is not None:
            self._wait_policy(wait_for, name, timeout)

    def clear_policy(
        self, name: str, *, wait_for: str | None = None, timeout: float = 10.0
    ) -> None:
        """Remove the policy ``name``; ``wait_for``: a queue to wait for until it has none."""
        self._drop_policy(name)
        if wait_for is not None:
            self._wait_policy(wait_for, None, timeout)

    def _put_policy(
        self, name: str, pattern: str, definition: Mapping[str, Any], apply_to: str, priority: int
    ) -> None:
        text = json.dumps(dict(definition))
        out = self._erl_eval(_set_policy_expr(self.vhost, name, pattern, text, priority, apply_to))
        if out is None:
            self.ctl(
                "set_policy", "-p", self.vhost, "--apply-to", apply_to,
                "--priority", str(priority), name, pattern, text,
            )  # fmt: skip
        elif out != "ok":
            raise BrokerError(f"the broker refused policy {name!r}: {_reason(out)}")

    def _drop_policy(self, name: str) -> None:
        out = self._erl_eval(_clear_policy_expr(self.vhost, name))
        if out is None:
            self.ctl("clear_policy", "-p", self.vhost, name)
        elif out != "ok":
            raise BrokerError(f"the broker could not clear policy {name!r}: {_reason(out)}")

    def policy_of(self, queue: str) -> str | None:
        """The name of the policy that applies to ``queue`` now, or None."""
        out = self._erl_eval(_policy_name_expr(self.vhost, queue))
        if out is not None and out.startswith("="):
            return bytes.fromhex(out[1:]).decode("utf-8") or None
        if out == "missing":
            return None
        out = self.ctl(
            "list_queues", "-p", self.vhost, "name", "policy", "--formatter", "json", "-q"
        )
        for row in json.loads(out[out.find("[") :] or "[]"):
            if row.get("name") == queue:
                return str(row["policy"]) if row.get("policy") else None
        return None

    def _wait_policy(self, queue: str, name: str | None, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.policy_of(queue) != name:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"queue {queue!r} did not show policy {name!r} within {timeout:.0f}s"
                )
            time.sleep(0.05)
