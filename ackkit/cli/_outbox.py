"""`ackkit outbox relay`: the inbox's outbox relay as a process of its own (see
`ackkit.inbox._relay`), until SIGINT/SIGTERM, or one round with --once."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import typer


def add_outbox(cli: typer.Typer, url_default: str, fail: Callable[..., Any]) -> None:
    """Register the `outbox` command group on `cli` (`fail(msg, url, code)` makes the
    masked error exit)."""
    import typer

    from ._run import LOG_LEVELS, configure_logging
    from ._url import url_option

    outbox = typer.Typer(help="The inbox's outbox (see ackkit.inbox).", no_args_is_help=True)
    cli.add_typer(outbox, name="outbox")

    @outbox.command("relay")
    def relay(
        url: list[str] = url_option([url_default]),  # noqa: B008 - typer's way
        dsn: str = typer.Option(
            ..., "--dsn", envvar="ACKKIT_OUTBOX_DSN", help="PostgreSQL DSN of the outbox."
        ),
        table: str = typer.Option("ackkit_outbox", "--table", help="The outbox table."),
        once: bool = typer.Option(False, "--once", help="Send what is there, then exit."),
        poll: float = typer.Option(
            1.0, "--poll", min=0.05, help="Seconds between looks at the outbox."
        ),
        log_level: str = typer.Option(
            "INFO", "--log-level", help=f"One of {', '.join(LOG_LEVELS)}.", case_sensitive=False
        ),
    ) -> None:
        """Send the outbox's messages (confirmed, oldest first, then deleted) until
        SIGINT/SIGTERM; --once: send what is there and exit."""
        from .._connection import addresses
        from ..inbox import Inbox
        from ..inbox._relay import run_relay

        level = log_level.upper()
        if level not in LOG_LEVELS:
            raise fail(f"--log-level must be one of {', '.join(LOG_LEVELS)}", url, 2)
        try:
            urls = addresses.parse(list(url))
            inbox = Inbox(dsn, outbox_table=table, retention=None)
            if inbox.in_memory:
                raise ValueError("--dsn must be a PostgreSQL DSN (the relay reads its table)")
        except (TypeError, ValueError) as exc:
            raise fail(str(exc), url, 2) from None
        configure_logging(level)
        stop = threading.Event()
        if not once and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda _n, _f: stop.set())
        where = f"{addresses.describe(urls)} from {inbox.safe_dsn} ({table})"
        print(f"ackkit: outbox relay to {where}", file=sys.stderr)
        try:
            sent = run_relay(urls, inbox, once=once, stop=stop, poll=poll)
        except Exception as exc:
            raise fail(f"{type(exc).__name__}: {exc}", url) from None
        print(f"ackkit: outbox relay stopped: {sent} sent", file=sys.stderr)
