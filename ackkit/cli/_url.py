"""The `--url` option of every command that talks to a broker: repeatable (one URL per
node of a cluster), read from AMQP_URL when not given."""

from __future__ import annotations

from typing import Any

URL_HELP = "AMQP URL; for a cluster, once per node or h1:5672,h2:5672 in one URL."
"""The option's help where a command has no better word for it."""


def url_option(default: list[str] | None, help: str = URL_HELP) -> Any:
    """A `typer.Option` for ``--url`` with `default` (None: the command finds its own)."""
    import typer

    return typer.Option(default, "--url", envvar="AMQP_URL", metavar="URL", help=help)
