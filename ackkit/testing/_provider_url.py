"""The broker of ``AMQP_URL``: used as it is, never stopped or restarted.

Counts and ctl go through the local ``rabbitmqctl`` (or the node named by
``ACKKIT_TEST_NODE``), after checking that node is the one behind the URL.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import urllib.parse

from ._commands import _check, _run
from ._env import _SBIN_DIRS, ENV_NODE, ENV_URL, HOW_TO_GET_A_BROKER
from ._errors import BrokerError, BrokerUnavailable
from ._handle import BrokerHandle
from ._queries import QueueCounts
from ._util import is_local_host, mask_url


class _UrlBroker(BrokerHandle):
    kind = "url"

    def __init__(self, url: str, *, check: bool = True) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("amqp", "amqps"):
            raise BrokerUnavailable(f"{ENV_URL}={mask_url(url)} is not an amqp:// or amqps:// URL")
        try:
            port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
        except ValueError as exc:
            raise BrokerUnavailable(f"{ENV_URL}={mask_url(url)}: bad port") from exc
        vhost = urllib.parse.unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
        super().__init__(
            url,
            own=False,
            amqp_port=port,
            node_name=os.environ.get(ENV_NODE) or None,
            vhost=vhost,
        )
        self._host = parts.hostname or "localhost"
        self._local = is_local_host(self._host)
        self._node_checked = False
        if check and not self.ping(timeout=10.0):
            raise BrokerUnavailable(
                f"{ENV_URL}={self.masked_url} does not answer AMQP (connection or login failed). "
                f"Start that broker or unset {ENV_URL}.\n{HOW_TO_GET_A_BROKER}"
            )

    def _ctl_path(self) -> str:
        if not self._local and not self.node_name:
            raise BrokerError(
                f"counts() and ctl() need rabbitmqctl access to the node, but the broker of "
                f"{ENV_URL}={self.masked_url} is not on this machine. Set {ENV_NODE}=<node@host> "
                f"(with the node's Erlang cookie in ~/.erlang.cookie), or unset {ENV_URL} so the "
                "kit starts a broker of its own."
            )
        path = os.pathsep.join([os.environ.get("PATH", ""), *_SBIN_DIRS])
        found = shutil.which("rabbitmqctl", path=path)
        if not found:
            raise BrokerError(
                f"counts() and ctl() for {ENV_URL}={self.masked_url} need rabbitmqctl, which is "
                "not installed (apt-get install -y rabbitmq-server provides it)."
            )
        return found

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        exe = self._ctl_path()
        cmd = [exe, *(["-n", self.node_name] if self.node_name else []), *args]
        res = _run(cmd, what="rabbitmqctl", timeout=timeout, cwd=tempfile.gettempdir())
        return _check(res, "rabbitmqctl", args)

    def _ctl_counts(self) -> dict[str, QueueCounts]:
        if not self._node_checked:
            self._check_node_serves_url()
        return super()._ctl_counts()

    def _check_node_serves_url(self) -> None:
        """Make sure the node rabbitmqctl talks to is the broker of AMQP_URL."""
        text = self.ctl("status", "--formatter", "json")
        try:
            status = json.loads(text[text.find("{") :])
            ports = {int(x["port"]) for x in status.get("listeners", []) if "amqp" in x["protocol"]}
        except (ValueError, KeyError, TypeError):
            ports = set()
        if ports and self.amqp_port not in ports:
            raise BrokerError(
                f"the local RabbitMQ node rabbitmqctl reaches listens for AMQP on {sorted(ports)}, "
                f"not on port {self.amqp_port} of {ENV_URL}={self.masked_url}; its counts would be "
                f"another broker's. Set {ENV_NODE}=<node name> for that broker."
            )
        self._node_checked = True

    def close_connections(self, reason: str = "closed by the ackkit test kit") -> None:
        self.ctl("close_all_connections", "-p", self.vhost, reason)
