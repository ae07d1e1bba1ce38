"""Which RabbitMQ's rules an in-memory broker follows: every per-version difference it
models, in one table.

The in-memory broker announces the version of its rules in its server properties, so
the runtimes pick their own `BrokerTraits` from it exactly as on a real node. These
rules are written down here from what the brokers did (tests/contract/RESULTS.md),
not derived from ackkit's `BrokerTraits`: a wrong trait in ackkit must show up as a
failing test, not be mirrored by the stand-in.

- 3.13 (the default) and 4.0: a quorum queue counts every return (reject, nack, a
  lost consumer) in `x-delivery-count`, written from the first return on; a
  publisher's `x-delivery-count` is overwritten (0) on a first delivery.
- 4.0 and 4.3: a quorum queue without `x-delivery-limit` has the limit 20; a
  publisher's `x-death` is ignored (dead-lettering counts only what the broker itself
  dead-lettered); a quorum queue's `x-max-length-bytes` counts the encoded properties
  as well as the body (3.x and classic queues: the body only; seen on 3.10.8 and
  4.3.6, 4.0 assumed to be 4.3).
- 4.3: only `basic.reject` and a lost consumer count in `x-delivery-count` (and
  toward the delivery limit), `basic.nack` does not; the header is written once the
  count is above 0 (a publisher's value passes until then); `x-acquired-count` counts
  every return and is always the broker's. Refused (the channel closes):
  `x-queue-version: 1` (as 4.3.6 does, 406), and, stricter than a 4.3.6 node with
  its default deprecated-feature settings: `x-queue-mode`, a transient non-exclusive
  queue and `basic.qos` with global=true (denied features on 4.3; the node permits
  the first two by default and answers the third with qos-ok).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._mem_state import PRECONDITION_FAILED, ChannelError


@dataclass(frozen=True)
class Rules:
    """One RabbitMQ version's rules, as the in-memory broker applies them."""

    version: str
    """What the broker announces (server properties "version")."""
    nack_counts: bool = True
    """basic.nack requeue increments a quorum queue's x-delivery-count (before 4.3)."""
    acquired_count: bool = False
    """x-acquired-count: every return, written by the broker on redeliveries (4.3)."""
    overwrite_first_delivery_count: bool = True
    """A publisher's x-delivery-count becomes 0 on a first delivery (before 4.3)."""
    default_delivery_limit: int | None = None
    """A quorum queue's delivery limit when it sets none (20 on 4.x)."""
    honours_client_x_death: bool = True
    """A publisher's x-death is continued when the broker dead-letters (before 4.0)."""
    refuses_classic_v1: bool = False
    """x-queue-version 1 and x-queue-mode are refused (4.3)."""
    refuses_transient_queues: bool = False
    """A non-durable, non-exclusive queue is refused (4.3)."""
    refuses_global_qos: bool = False
    """basic.qos global=true is refused (4.3)."""
    quorum_size_counts_properties: bool = False
    """A quorum queue's x-max-length-bytes counts each message's encoded properties as
    well as its body (4.x; seen on 4.3.6: 2 bytes of property flags more per message)."""

    def delivery_limit(self, declared: object) -> int | None:
        """The delivery limit of a quorum queue that declared `declared` (or nothing)."""
        if isinstance(declared, int) and not isinstance(declared, bool):
            return declared
        return self.default_delivery_limit

    def check_queue_declare(
        self, name: str, durable: bool, exclusive: bool, arguments: dict[str, object]
    ) -> None:
        """Raise the ChannelError this version answers a queue.declare with, if any."""
        if not self.refuses_classic_v1 and not self.refuses_transient_queues:
            return
        version = arguments.get("x-queue-version")
        if self.refuses_classic_v1 and version is not None and str(version) == "1":
            raise ChannelError(
                PRECONDITION_FAILED, f"PRECONDITION_FAILED - unsupported queue version '{version}'"
            )
        if self.refuses_classic_v1 and "x-queue-mode" in arguments:
            raise ChannelError(
                PRECONDITION_FAILED,
                "PRECONDITION_FAILED - x-queue-mode is a classic queue v1 argument, "
                f"removed in RabbitMQ 4.3 (queue '{name}', ackkit in-memory broker)",
            )
        if self.refuses_transient_queues and not durable and not exclusive:
            raise ChannelError(
                PRECONDITION_FAILED,
                "PRECONDITION_FAILED - transient non-exclusive queues are a denied "
                f"deprecated feature (transient_nonexcl_queues) on RabbitMQ 4.3 (queue '{name}')",
            )

    def check_qos(self, global_qos: bool) -> None:
        if global_qos and self.refuses_global_qos:
            raise ChannelError(
                PRECONDITION_FAILED,
                "PRECONDITION_FAILED - global QoS is a denied deprecated feature (global_qos) "
                "on RabbitMQ 4.3",
            )


V3_13 = Rules("3.13.7")
V4_0 = Rules(
    "4.0.5",
    default_delivery_limit=20,
    honours_client_x_death=False,
    quorum_size_counts_properties=True,
)
V4_3 = Rules(
    "4.3.6",
    quorum_size_counts_properties=True,
    nack_counts=False,
    acquired_count=True,
    overwrite_first_delivery_count=False,
    default_delivery_limit=20,
    honours_client_x_death=False,
    refuses_classic_v1=True,
    refuses_transient_queues=True,
    refuses_global_qos=True,
)

RULES = {"3.13": V3_13, "4.0": V4_0, "4.3": V4_3}
"""The rules an in-memory broker can follow, by series."""
DEFAULT = "3.13"

_ALIASES = {"3": "3.13", "3.10": "3.13", "3.13": "3.13", "4": "4.3", "4.0": "4.0", "4.3": "4.3"}


def rules_for(rabbitmq: str | None) -> Rules:
    """The rules of `rabbitmq` ("3.13", "4.0", "4.3"; "3.10" and "3" follow 3.13, "4"
    4.3; None: the default 3.13)."""
    raw = DEFAULT if rabbitmq is None else str(rabbitmq).strip().lower()
    series = _ALIASES.get(raw)
    if series is None:
        raise ValueError(
            f"rabbitmq={rabbitmq!r}: the in-memory broker follows RabbitMQ "
            f"{', '.join(RULES)} (3.10 and 3 mean 3.13, 4 means 4.3)"
        )
    return RULES[series]
