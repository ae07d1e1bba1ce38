"""Test kit: a real RabbitMQ broker for ackkit's tests and for users' own suites."""

from ._broker import (
    BrokerError,
    BrokerHandle,
    BrokerNotOwned,
    BrokerUnavailable,
    QueueCounts,
    QueueNotFound,
    provision_broker,
)
from ._util import mask_url

__all__ = [
    "BrokerError",
    "BrokerHandle",
    "BrokerNotOwned",
    "BrokerUnavailable",
    "QueueCounts",
    "QueueNotFound",
    "mask_url",
    "provision_broker",
]
