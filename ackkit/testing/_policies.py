"""Policies on the test's broker: what an operator sets with ``rabbitmqctl set_policy``.

A real node (one the kit started, or a container) gets them through ``rabbitmqctl``;
the in-memory broker applies them itself (`_mem_topology`), with RabbitMQ's rules for
combining a policy with the queue's own arguments.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from typing import Any

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


class PolicyControl:
    """``set_policy`` / ``clear_policy`` / ``policy_of`` of a broker handle: through
    rabbitmqctl here; the in-memory broker puts, drops and reads policies itself."""

    vhost: str

    def ctl(self, *args: str, timeout: float = 60.0) -> str:  # pragma: no cover - the handle's
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
        self.ctl(
            "set_policy",
            "-p",
            self.vhost,
            "--apply-to",
            apply_to,
            "--priority",
            str(priority),
            name,
            pattern,
            json.dumps(dict(definition)),
        )

    def _drop_policy(self, name: str) -> None:
        self.ctl("clear_policy", "-p", self.vhost, name)

    def policy_of(self, queue: str) -> str | None:
        """The name of the policy that applies to ``queue`` now, or None."""
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
