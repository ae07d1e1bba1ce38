"""The files of a throwaway node of the kit's own: its data directory (mnesia,
logs, plugins, config, Erlang cookie, TLS copies), made before it boots and read
when something goes wrong.

Paths come in two views: ``_path`` is where the kit finds a file, ``_inner`` is
where the node sees it (the same for a node from the machine's own
``rabbitmq-server``; inside the root for a node in a Debian root).
"""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
import shutil

from ackkit.testing import NodeTLS
from ackkit.testing.providers import PLUGINS

from ._proc import tail


class _NodeFiles:
    """Mixin: the data directory ``_base`` of a node and what is written into it."""

    _base: str
    _tls: NodeTLS | None
    _user: tuple[int, int] | None  # owner of the files (the user the node runs as)
    amqp_port: int
    amqps_port: int | None
    _streams: bool = False
    _cookie: str | None = None  # the Erlang cookie (None: a random one of the node's own)
    _more_config: str = ""  # rabbitmq.conf lines the node was given (e.g. a cluster's)
    _advanced_config: str = ""  # its advanced.config (Erlang terms), when given one
    stream_port: int | None = None
    """The stream protocol port of a node booted with ``streams=True`` (else None)."""

    def _path(self, *parts: str) -> str:
        return os.path.join(self._base, *parts)

    def _inner(self, *parts: str) -> str:
        """The path as the node sees it."""
        return self._path(*parts)

    def _prepare_dir(self) -> None:
        for sub in ("mnesia", "log", "conf.d"):
            os.makedirs(self._path(sub), exist_ok=True)
        if self._tls is not None:
            os.makedirs(self._path("tls"), exist_ok=True)
            for name, src in self._tls_files().items():
                shutil.copyfile(src, self._path("tls", name))
                os.chmod(self._path("tls", name), 0o400)
        with open(self._path("enabled_plugins"), "w", encoding="ascii") as fh:
            plugins = (*PLUGINS, "rabbitmq_stream") if self._streams else PLUGINS
            fh.write(f"[{','.join(plugins)}].\n")
        with open(self._path("rabbitmq-env.conf"), "w", encoding="ascii") as fh:
            fh.write(
                "# throwaway node of the ackkit test kit; settings come from the environment\n"
            )
        if self._advanced_config:
            with open(self._path("advanced.config"), "w", encoding="ascii") as fh:
                fh.write(self._advanced_config)
        cookie = self._path(".erlang.cookie")
        with open(cookie, "w", encoding="ascii") as fh:
            fh.write(self._cookie or secrets.token_hex(20).upper())
        os.chmod(cookie, 0o400)
        if self._user is not None:
            uid, gid = self._user
            for root, dirs, files in os.walk(self._base):
                os.chown(root, uid, gid)
                for item in dirs + files:
                    os.chown(os.path.join(root, item), uid, gid)

    def _tls_files(self) -> dict[str, str]:
        tls = self._tls
        assert tls is not None
        return {"ca.pem": tls.ca_file, "cert.pem": tls.cert_file, "key.pem": tls.key_file}

    def _write_config(self) -> None:
        path = self._path("rabbitmq.conf")
        with open(path, "w", encoding="ascii") as fh:
            fh.write(
                f"listeners.tcp.local = 127.0.0.1:{self.amqp_port}\n"
                "loopback_users.guest = true\n"
                "log.console = false\n"
                "log.file.level = info\n"
            )
            fh.write(self._extra_config())
            if self._streams:
                # Loopback only, and advertised as such: a stream client connects where the
                # node's metadata points it (by default the host name).
                fh.write(
                    f"stream.listeners.tcp.1 = 127.0.0.1:{self.stream_port}\n"
                    "stream.advertised_host = 127.0.0.1\n"
                    f"stream.advertised_port = {self.stream_port}\n"
                )
            tls = self._tls
            if tls is not None:
                fh.write(
                    f"listeners.ssl.local = 127.0.0.1:{self.amqps_port}\n"
                    f"ssl_options.cacertfile = {self._inner('tls', 'ca.pem')}\n"
                    f"ssl_options.certfile = {self._inner('tls', 'cert.pem')}\n"
                    f"ssl_options.keyfile = {self._inner('tls', 'key.pem')}\n"
                    "ssl_options.verify = "
                    + ("verify_peer" if tls.verify_peer else "verify_none")
                    + "\n"
                    "ssl_options.fail_if_no_peer_cert = "
                    + ("true" if tls.fail_if_no_peer_cert else "false")
                    + "\n"
                )
        if self._user is not None:
            os.chown(path, *self._user)

    def _extra_config(self) -> str:
        """More rabbitmq.conf lines (a provider's own, or the ones the node was given)."""
        return self._more_config

    def _log_tails(self) -> str:
        parts = []
        for name in ("console.log", "node.log"):
            text = tail(self._path("log", name), 30)
            if text:
                parts.append(f"--- {self._path('log', name)} (last lines) ---\n{text}")
        return "\n".join(parts) or "(the node wrote no log)"

    def log_text(self) -> str | None:
        texts = []
        for name in sorted(glob.glob(self._path("log", "*.log"))):
            if os.path.basename(name) == "console.log":
                continue
            with contextlib.suppress(OSError), open(name, encoding="utf-8", errors="replace") as fh:
                texts.append(fh.read())
        return "".join(texts)
