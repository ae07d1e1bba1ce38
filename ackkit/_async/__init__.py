"""The asyncio runtime on aio-pika (install with `pip install "ackkit[async]"`).

Modules are imported explicitly (`ackkit._async.app`, ...) so that
`ackkit._async.delivery` stays importable without aio-pika; `public` loads the
asyncio names of the public API (`ackkit.AsyncApp`, `ackkit.pull.aconnect`, ...)
on first use, with the install hint when aio-pika is missing.
"""

import importlib
from typing import Any

PUBLIC = {
    "AsyncApp": "app",
    "AsyncDelivery": "delivery",
    "AsyncPullConnection": "pull",
    "aconnect": "pull",
}
"""The asyncio names of the public API, by the module of this package that holds each."""
INSTALL_HINT = 'pip install "ackkit[async]"'
"""How to install what the asyncio runtime needs (the `async` extra)."""


def public(name: str) -> Any:
    """The asyncio name `name` (one of `PUBLIC`), importing its module (and aio-pika) on
    first use; an ImportError with the install hint when aio-pika is missing."""
    try:
        module = importlib.import_module(f"{__name__}.{PUBLIC[name]}")
    except ImportError as exc:
        if exc.name not in ("aio_pika", "aiormq", "pamqp", "yarl"):
            raise
        raise ImportError(
            f"ackkit.{name} needs aio-pika, which is not installed: {INSTALL_HINT}", name=exc.name
        ) from exc
    return getattr(module, name)
