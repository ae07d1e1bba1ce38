"""What a caller may ask of a broker node the kit starts: TLS files, and the plugins
every kit broker runs. Plain values, so ``provision_broker``'s signature and
``ackkit.testing.NodeTLS`` need no provisioning code (that is ackkit-testkit's)."""

from __future__ import annotations

import dataclasses

__all__ = ["PLUGINS", "NodeTLS"]

PLUGINS = ("rabbitmq_consistent_hash_exchange",)
"""Plugins every node of the kit's own runs: the x-consistent-hash exchange (bundled
with every RabbitMQ 3.x and 4.x, off by default), so that shard layouts
(:mod:`ackkit.shards`) run against it on every version the kit provides."""


@dataclasses.dataclass(frozen=True)
class NodeTLS:
    """PEM files for a TLS (amqps) listener on a broker node of the kit's own.

    ``verify_peer``: ask clients for a certificate and check it against ``ca_file``;
    ``fail_if_no_peer_cert``: refuse clients that present none (client certificates
    required). The node copies the files into its data directory.
    """

    ca_file: str
    cert_file: str
    key_file: str
    verify_peer: bool = True
    fail_if_no_peer_cert: bool = False
