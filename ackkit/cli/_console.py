"""`ackkit console`: the web console for dead letters, registered on the typer app by
`cli.build_cli`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import typer


def add_console(cli: typer.Typer, *, err: Callable[[], Any], fail: Callable[..., Any]) -> None:
    """Register the `console` command on `cli` (a `typer.Typer`); `err` makes the stderr
    console and `fail` the error exit, as in `build_cli`."""
    import typer

    from ..dead_letters._queue import safe_error
    from ._url import url_option

    @cli.command("console")
    def console(
        url: list[str] | None = url_option(None),  # noqa: B008 - typer's way
        dlq_names: list[str] = typer.Option(  # noqa: B008 - typer's way
            [], "--dlq", help="A dead-letter queue to show (repeatable)."
        ),
        target: str | None = typer.Option(
            None, "--app", help="module:app: show the dead-letter queues of its listeners."
        ),
        host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
        port: int = typer.Option(8470, "--port", min=0, max=65535, help="Port to listen on."),
        token: str | None = typer.Option(
            None, "--token", envvar="ACKKIT_CONSOLE_TOKEN", help="Require this token."
        ),
        basic_auth: str | None = typer.Option(
            None, "--basic-auth", envvar="ACKKIT_CONSOLE_BASIC_AUTH", help="USER:PASSWORD."
        ),
        read_only: bool = typer.Option(False, "--read-only", help="No replay, no delete."),
        max_held: int = typer.Option(
            100_000, "--max-held", min=1, help="Dead letters held per DLQ (the rest wait)."
        ),
    ) -> None:
        """A web console for dead letters: overview, failure groups, replay, delete, export."""
        try:
            from ..console._serve import from_options, serve

            broker, names, access = from_options(
                url=url,
                dlqs=dlq_names,
                app_target=target,
                host=host,
                token=token,
                basic_auth=basic_auth,
                read_only=read_only,
            )
        except Exception as exc:
            raise fail(str(exc), url or (), 2) from None
        stderr = err()
        try:  # the address is printed once it answers there, not before
            serve(
                broker,
                names,
                access=access,
                port=port,
                max_held=max_held,
                say=lambda line: stderr.print(line, markup=False),
            )
        except KeyboardInterrupt:
            pass
        except Exception as exc:
            raise fail(safe_error(exc, broker), broker) from None
