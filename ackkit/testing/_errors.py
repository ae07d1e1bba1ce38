"""What goes wrong when the kit provisions or drives a broker."""

from __future__ import annotations

__all__ = ["BrokerError", "BrokerNotOwned", "BrokerUnavailable", "QueueNotFound"]


class BrokerUnavailable(RuntimeError):
    """No broker could be provisioned; the message says why and how to get one."""


class BrokerError(RuntimeError):
    """A broker operation (rabbitmqctl, restart, ...) failed."""


class BrokerNotOwned(BrokerError):
    """The operation needs a node the kit started (restart/stop/start/kill)."""


class QueueNotFound(BrokerError):
    """``counts()``/``purge()`` on a queue that does not exist."""
