"""The `ackkit` command: dead-letter queues, queue counts, running an app, its AsyncAPI.

    ackkit dlq inspect QUEUE [--limit N] [--format auto|table|tsv|json]
    ackkit dlq replay QUEUE [--to Q] [--error-type T] [--reason-contains S]
                            [--message-id ID ...] [--limit N] [--json]
    ackkit queues [QUEUE ...] [--format ...] [--source auto|management|rabbitmqctl|amqp] [-v]
    ackkit run module:app [--url URL] [--workers N] [--startup-timeout S] [--log-level L]
                          [--metrics-port P [--metrics-addr A]]
    ackkit docs module:app [--format json|yaml] [--output FILE]
    ackkit console (--dlq NAME ... | --app module:app) [--url URL] [--host H] [--port P]
                   [--token T | --basic-auth USER:PASSWORD] [--read-only]
    ackkit outbox relay --dsn DSN [--url URL] [--table T] [--once]
    ackkit --version

The broker URL comes from --url or AMQP_URL; passwords are masked in all output. A
cluster's nodes: --url once per node, or the comma form of one URL
(amqp://u:p@h1:5672,h2:5672/vhost), or AMQP_URL holding either (URLs separated by
spaces); the first address is tried first, then the next (docs/reference/configuration.md).
Listings are a table on a terminal and TSV when piped (--format chooses).
typer and rich come with the `cli` extra: pip install 'ackkit[cli]'.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from .._connection import addresses
from .._connection.url import mask_text, mask_url
from ._console import add_console
from ._outbox import add_outbox
from ._output import OutputFormat
from ._run import (
    LOG_LEVELS,
    configure_logging,
    load_app,
    run_app,
    run_workers,
    set_startup_timeout,
    stopped_line,
)

if TYPE_CHECKING:
    import typer

__all__ = ["build_cli", "load_app", "main", "run_app", "run_workers"]

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2f"
INSTALL_HINT = "the ackkit command needs typer and rich: pip install 'ackkit[cli]'"


def _secrets(url: str | Sequence[str]) -> list[str]:
    out: set[str] = set()
    for u in [url] if isinstance(url, str) else url:
        try:
            pw = urlsplit(u).password
        except ValueError:
            continue  # cannot be split: mask_url still masks its user:password@
        if pw:
            out |= {pw, unquote(pw)}
    return [s for s in out if s and s != "guest"]


def _safe(text: str, url: str | Sequence[str]) -> str:
    return mask_text(text, *_secrets(url))


def node_urls(given: str | Sequence[str]) -> tuple[str, ...]:
    """The node addresses of --url / AMQP_URL: each value one URL or the comma form
    (`ackkit._connection.addresses`); ValueError / TypeError, passwords masked."""
    return addresses.parse(given if isinstance(given, str) else list(given))


def _flow_printer(console: Any) -> Any:
    """An event observer printing a line when a listener is paused, resumed, tripped,
    probing or recovered (not called for healthy messages)."""
    from .._telemetry.logs import flow_line

    def show(ev: Any) -> None:
        line = flow_line(ev)
        if line is not None:
            console.print(f"ackkit: {line}", highlight=False, markup=False)

    show.hot = False  # type: ignore[attr-defined]
    return show


def build_cli() -> typer.Typer:
    """The typer application (imports typer and rich)."""
    import typer
    from rich.console import Console
    from rich.markup import escape

    from .. import __version__
    from ..dead_letters._letter import ReplayFilter
    from ..dead_letters._queue import DeadLetterQueue, safe_error
    from ._output import (
        DEAD_LETTER_FIELDS,
        Column,
        dead_letter_table,
        json_text,
        resolve,
        table,
        tsv,
    )
    from ._queues import SOURCES, QueueSourceError, list_queues
    from ._url import url_option

    def err() -> Console:  # made per call: the width and the streams are the caller's now
        return Console(stderr=True, highlight=False, soft_wrap=True)

    cli = typer.Typer(
        help="ackkit: RabbitMQ acknowledgement tools (dead-letter queues, queue counts, run, "
        "AsyncAPI docs).",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    dlq = typer.Typer(help="Inspect and replay dead-letter queues.", no_args_is_help=True)
    cli.add_typer(dlq, name="dlq")

    def show_version(value: bool) -> None:
        if value:
            print(f"ackkit {__version__}")
            raise typer.Exit()

    @cli.callback()
    def _root(
        version: bool = typer.Option(
            False,
            "--version",
            callback=show_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ) -> None:
        """ackkit: RabbitMQ acknowledgement tools."""

    url_opt = url_option([DEFAULT_URL])
    format_opt = typer.Option(
        OutputFormat.AUTO,
        "--format",
        "-f",
        help="table (fits the terminal), tsv or json; auto: table on a terminal, tsv when piped.",
    )

    def fail(msg: str, url: str | Sequence[str], code: int = 1) -> typer.Exit:
        err().print(f"[red]error:[/red] {escape(_safe(msg, url))}", markup=True)
        return typer.Exit(code)

    def emit(text: str, url: str | Sequence[str]) -> None:
        sys.stdout.write(_safe(text, url))
        sys.stdout.flush()

    def nodes(url: Sequence[str]) -> tuple[str, ...]:
        try:
            return node_urls(url)
        except (TypeError, ValueError) as exc:
            raise fail(f"--url: {exc}", url, 2) from None

    def width() -> int:
        return Console().width  # the terminal's, or COLUMNS, or 80

    @dlq.command("inspect")
    def dlq_inspect(
        queue: str = typer.Argument(..., help="The dead-letter queue, e.g. orders.dlq."),
        limit: int = typer.Option(20, "--limit", "-n", min=0, help="Messages to show (0: all)."),
        fmt: OutputFormat = format_opt,
        as_json: bool = typer.Option(False, "--json", help="The same as --format json."),
        url: list[str] = url_opt,
    ) -> None:
        """Count and list dead letters (read and put back: nothing is removed)."""
        urls = nodes(url)
        try:
            with DeadLetterQueue(urls, queue, connection_name="ackkit-cli") as q:
                count = q.count()
                letters = q.inspect(limit or None)
        except Exception as exc:
            raise fail(safe_error(exc, url), url) from None
        fmt = resolve(fmt, as_json=as_json, tty=sys.stdout.isatty())
        if fmt is OutputFormat.JSON:
            data = {"queue": queue, "count": count, "messages": [d.to_dict() for d in letters]}
            emit(json_text(data) + "\n", url)
            return
        rows = []
        for d in letters:
            fields = d.to_dict()
            fields["notes"] = "; ".join(d.notes) or None
            rows.append([fields.get(k) for k in DEAD_LETTER_FIELDS])
        if fmt is OutputFormat.TSV:
            emit(tsv(DEAD_LETTER_FIELDS, rows), url)
            return
        shown = dead_letter_table(rows, width())
        origin = f", all from {shown.queue}" if shown.queue and letters else ""
        emit(f"{queue}: {count} message(s){origin}\n" + shown.render(width()), url)
        if len(letters) < count:
            emit(f"({count - len(letters)} more; --limit 0 shows all)\n", url)

    @dlq.command("replay")
    def dlq_replay(
        queue: str = typer.Argument(..., help="The dead-letter queue to replay from."),
        to: str | None = typer.Option(None, "--to", help="Target queue (default: the origin)."),
        error_type: str | None = typer.Option(None, "--error-type", help="Only this error."),
        reason_contains: str | None = typer.Option(
            None, "--reason-contains", help="Only reasons containing this (any case)."
        ),
        message_id: list[str] = typer.Option(  # noqa: B008 - typer's way
            [], "--message-id", help="Only these message ids (repeatable)."
        ),
        limit: int = typer.Option(0, "--limit", "-n", min=0, help="Replay at most N (0: all)."),
        as_json: bool = typer.Option(False, "--json", help="JSON report."),
        url: list[str] = url_opt,
    ) -> None:
        """Publish dead letters back (confirmed) and only then remove them from the DLQ."""
        flt = ReplayFilter(error_type, reason_contains, frozenset(message_id))
        urls = nodes(url)
        try:
            with DeadLetterQueue(urls, queue, connection_name="ackkit-cli") as q:
                report = q.replay(to=to, select=flt, limit=limit or None)
        except Exception as exc:
            raise fail(safe_error(exc, url), url) from None
        if as_json:
            emit(json_text(report.to_dict()) + "\n", url)
        else:
            where = ", ".join(f"{n} -> {t}" for t, n in report.targets.items()) or "-"
            emit(
                f"{queue}: examined {report.examined}, replayed {report.replayed} ({where}), "
                f"left {report.left} (filtered {report.skipped}, no origin {report.no_target}, "
                f"failed {report.failed}); {report.remaining} in the queue now\n",
                url,
            )
            for e in report.errors:
                err().print(_safe(e, url), markup=False)
        if report.failed:
            raise typer.Exit(1)

    @cli.command("queues")
    def queues(
        names: list[str] = typer.Argument(None, help="Only these queues (needed for AMQP)."),  # noqa: B008
        fmt: OutputFormat = format_opt,
        as_json: bool = typer.Option(False, "--json", help="The same as --format json."),
        source: str = typer.Option(
            "auto", "--source", help=f"One of {', '.join(SOURCES)} (auto tries them in order)."
        ),
        management_url: str | None = typer.Option(
            None, "--management-url", help="Management API base (default http://HOST:15672)."
        ),
        node: str | None = typer.Option(None, "--node", help="Node name for rabbitmqctl."),
        verbose: bool = typer.Option(
            False, "--verbose", "-v", help="Also say which sources failed before one answered."
        ),
        url: list[str] = url_opt,
    ) -> None:
        """Queue counts (name, ready, unacked, total, consumers) like rabbitmqctl list_queues.
        Exits 1 when a queue named on the command line does not exist."""
        if source not in SOURCES:
            raise fail(f"--source must be one of {', '.join(SOURCES)}", url, 2)
        urls = nodes(url)
        try:
            listing = list_queues(
                urls, names or (), source=source, management_url=management_url, node=node
            )
        except (QueueSourceError, Exception) as exc:
            raise fail(safe_error(exc, url), url) from None
        fmt = resolve(fmt, as_json=as_json, tty=sys.stdout.isatty())
        if fmt is OutputFormat.JSON:
            emit(json_text({"url": addresses.describe(urls), **listing.to_dict()}) + "\n", url)
            return
        keys = ("name", "ready", "unacked", "total", "consumers")
        rows = [[r.to_dict()[k] for k in keys] for r in listing.rows]
        if fmt is OutputFormat.TSV:
            emit(tsv(keys, rows), url)
        else:
            cols = [Column("name", 12), *(Column(k, 5, numeric=True) for k in keys[1:])]
            where = listing.node or addresses.describe(urls)
            title = f"queues of {where} (source: {listing.source})\n"
            emit(title + table(cols, rows, width()), url)
        for note in listing.notes:
            # A source that did not answer before another did is not news on every call.
            if verbose or not note.startswith(tuple(f"{s}:" for s in SOURCES)):
                err().print(_safe(note, url), markup=False)
        if listing.missing:  # asked for by name and not there: a script must notice
            raise typer.Exit(1)

    @cli.command("run")
    def run(
        target: str = typer.Argument(..., help="module:app (an App or AsyncApp, or a factory)."),
        url: list[str] | None = url_option(  # noqa: B008 - typer's way
            None, "Broker URL, once per node of a cluster (default: the app's own URL)."
        ),
        workers: int = typer.Option(1, "--workers", "-w", min=1, help="Processes to run."),
        startup_timeout: float | None = typer.Option(
            None,
            "--startup-timeout",
            min=0.1,
            help="Seconds to connect and start consuming before giving up (default: the "
            "app's startup_timeout, 60 s).",
        ),
        log_level: str = typer.Option(
            "INFO", "--log-level", help=f"One of {', '.join(LOG_LEVELS)}.", case_sensitive=False
        ),
        metrics_port: int | None = typer.Option(
            None,
            "--metrics-port",
            min=0,
            help="Serve Prometheus metrics on this port (worker i of --workers: port + i).",
        ),
        metrics_addr: str = typer.Option(
            "127.0.0.1",
            "--metrics-addr",
            help="Address the metrics server listens on (loopback unless you say otherwise).",
        ),
    ) -> None:
        """Run an app until SIGINT/SIGTERM, then shut down gracefully (flush acks, requeue)."""
        level = log_level.upper()
        if level not in LOG_LEVELS:
            raise fail(f"--log-level must be one of {', '.join(LOG_LEVELS)}", url or "", 2)
        if workers > 1:
            opts = ["--log-level", level]
            if startup_timeout is not None:
                opts += ["--startup-timeout", str(startup_timeout)]
            raise typer.Exit(
                run_workers(target, workers, url, metrics_port, metrics_addr, options=opts)
            )
        configure_logging(level)
        try:
            app = load_app(target)
            if url:
                app.url = list(url)
            if startup_timeout is not None:
                set_startup_timeout(app, startup_timeout)
        except Exception as exc:
            raise fail(f"cannot load {target}: {exc}", url or "") from None
        shown = str(getattr(app, "safe_url", "")) or mask_url(str(getattr(app, "url", "")))
        if metrics_port is not None:
            try:
                from ..metrics import PrometheusMetrics

                PrometheusMetrics(app).serve(metrics_port, metrics_addr)
            except (ImportError, OSError) as exc:
                raise fail(f"--metrics-port {metrics_port}: {exc}", url or "") from None
            err().print(f"ackkit: metrics on http://{metrics_addr}:{metrics_port}/metrics")
        if hasattr(app, "on_event"):
            app.on_event(_flow_printer(err()))  # paused, tripped, probing, recovered
        err().print(f"ackkit: running {target} ({shown}), pid {os.getpid()}", markup=False)
        try:
            run_app(app)
        except KeyboardInterrupt:
            pass
        except Exception as exc:
            raise fail(f"{type(exc).__name__}: {exc}", getattr(app, "urls", "")) from None
        if hasattr(app, "stats"):
            err().print(stopped_line(target, app.stats()), markup=False)

    @cli.command("docs")
    def docs(
        target: str = typer.Argument(..., help="module:app (an App or AsyncApp, or a factory)."),
        fmt: str = typer.Option("json", "--format", "-f", help="json or yaml."),
        output: str | None = typer.Option(
            None, "--output", "-o", help="Write to this file (default: standard output)."
        ),
        title: str | None = typer.Option(None, "--title", help="info.title (default: target)."),
        version: str = typer.Option("1.0.0", "--app-version", help="info.version."),
    ) -> None:
        """Write an AsyncAPI 3.0 document of the app's listeners (nothing is connected)."""
        from .._app.asyncapi import document, to_yaml

        if fmt not in ("json", "yaml"):
            raise fail("--format must be json or yaml", "", 2)
        try:
            app = load_app(target)
        except Exception as exc:
            raise fail(f"cannot load {target}: {exc}", "") from None
        doc = document(app, title=title or target, version=version)
        text = (json.dumps(doc, indent=2) if fmt == "json" else to_yaml(doc)) + "\n"
        text = _safe(text, str(app.url))
        if output:
            with open(output, "w", encoding="utf-8") as f:
                f.write(text)
            err().print(f"ackkit: wrote {output} ({len(doc['channels'])} channels)", markup=False)
        else:
            sys.stdout.write(text)

    add_console(cli, err=err, fail=fail)

    add_outbox(cli, DEFAULT_URL, fail)
    return cli


def main(argv: list[str] | None = None) -> None:
    """Console entry point (`ackkit`)."""
    try:
        import rich  # noqa: F401
        import typer  # noqa: F401
    except ImportError:
        print(f"error: {INSTALL_HINT}", file=sys.stderr)
        raise SystemExit(2) from None
    cli = build_cli()
    cli(args=argv, prog_name="ackkit")
