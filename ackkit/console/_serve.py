"""`ackkit console`: what to hold (an app's DLQs or named ones), then serve the pages."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any

from .._connection import addresses
from ._holder import Holder
from ._security import Access
from ._store import Store

log = logging.getLogger("ackkit.console")
INSTALL_HINT = "ackkit console needs Starlette, Jinja2 and uvicorn: pip install 'ackkit[console]'"


def dlqs_of_app(app: Any) -> list[str]:
    """The dead-letter queues of an App's or AsyncApp's listeners, in order, once each."""
    out: list[str] = []
    for spec in getattr(app, "specs", ()):
        q = spec.policy.dead_letter_queue
        if q is not None and q not in out:
            out.append(q)
    return out


def serve(
    url: str | Sequence[str],
    dlqs: Sequence[str],
    *,
    access: Access,
    port: int = 8470,
    max_held: int = 100_000,
    title: str = "",
    say: Callable[[str], None] | None = None,
) -> None:
    """Hold the DLQs, serve the console until interrupted, then let go of everything
    (the broker returns every held dead letter to its queue).

    `say` gets the lines for the person who started it: what it waits for while it
    connects (every few seconds), then the console's address once it answers there
    (never before: under load the broker can take minutes to start delivering).

    `url`: one URL, the comma form or a list of a cluster's node addresses (the holder
    connects to the first that answers, and after a lost connection to the next)."""
    try:
        import uvicorn

        from ._web import create_app
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} ({exc})") from None
    if not logging.getLogger("ackkit.console").handlers:  # the audit lines go to stderr
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
        logging.getLogger("ackkit.console").addHandler(handler)
        logging.getLogger("ackkit.console").setLevel(logging.INFO)
    tell = say or (lambda line: log.info("%s", line))
    store = Store(dlqs)
    holder = Holder(url, dlqs, store, max_held=max_held)
    shown = holder.safe_url

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started and not self.should_exit:
                host, bound = self.servers[0].sockets[0].getsockname()[:2]
                host = f"[{host}]" if ":" in host else host
                tell(f"ackkit: console on http://{host}:{bound}/ ({shown})")

    try:
        tell(f"ackkit console: {holder.waiting_for()}")
        holder.start(timeout=None, progress=lambda what: tell(f"ackkit console: {what}"))
        app = create_app(holder, access, title=title)
        Server(uvicorn.Config(app, host=access.host, port=port, log_level="warning")).run()
    finally:
        held = sum(store.held(q) for q in dlqs)
        log.warning("ackkit console: stopping; the broker takes back %d dead letters", held)
        holder.stop()


def from_options(
    *,
    url: str | Sequence[str] | None,
    dlqs: Sequence[str],
    app_target: str | None,
    host: str,
    token: str | None,
    basic_auth: str | None,
    read_only: bool,
) -> tuple[str | tuple[str, ...], list[str], Access]:
    """The broker URL (a tuple of node URLs for several), DLQs and access rules of
    `ackkit console`'s options (ValueError with what to change when they do not fit
    together). `url`: --url's values (each one URL or the comma form), else the app's
    addresses."""
    names = list(dlqs)
    if app_target:
        from ..cli._run import load_app

        app = load_app(app_target)
        url = url or tuple(getattr(app, "urls", ())) or str(app.url)
        names += [q for q in dlqs_of_app(app) if q not in names]
        if not names:
            raise ValueError(f"{app_target} has no listener with a dead-letter queue; give --dlq")
    if not names:
        raise ValueError("name the dead-letter queues: --dlq NAME (repeatable) or --app module:app")
    if not url:
        raise ValueError("no broker URL: give --url or set AMQP_URL")
    basic = None
    if basic_auth is not None:
        user, sep, pw = basic_auth.partition(":")
        if not sep:
            raise ValueError("--basic-auth must be USER:PASSWORD")
        basic = (user, pw)
    urls = addresses.parse(url)  # checked now: a bad address fails before anything starts
    access = Access(host=host, token=token, basic=basic, read_only=read_only)
    return (urls[0] if len(urls) == 1 else urls), names, access
