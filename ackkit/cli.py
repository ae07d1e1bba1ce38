"""The `ackkit` command: dead-letter queues, queue counts, running an App.

    ackkit dlq inspect QUEUE [--limit N] [--json]
    ackkit dlq replay QUEUE [--to Q] [--error-type T] [--reason-contains S]
                            [--message-id ID ...] [--limit N] [--json]
    ackkit queues [QUEUE ...] [--json] [--source auto|management|rabbitmqctl|amqp]
    ackkit run module:app [--workers N] [--metrics-port P [--metrics-addr A]]

The broker URL comes from --url or AMQP_URL; passwords are masked in all output.
typer and rich come with the `cli` extra: pip install 'ackkit[cli]'.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from ._url import mask_text, mask_url

if TYPE_CHECKING:
    import typer

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2f"
INSTALL_HINT = "the ackkit command needs typer and rich: pip install 'ackkit[cli]'"


def _secrets(url: str) -> list[str]:
    pw = urlsplit(url).password
    if not pw:
        return []
    return [s for s in {pw, unquote(pw)} if s and s != "guest"]


def _safe(text: str, url: str) -> str:
    return mask_text(text, *_secrets(url))


def load_app(target: str) -> Any:
    """`module:attr` (attr defaults to `app`) -> the App object; the cwd is importable."""
    mod_name, _, attr = target.partition(":")
    if not mod_name:
        raise ValueError(f"expected module:app, got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = importlib.import_module(mod_name)
    obj: Any = module
    for part in (attr or "app").split("."):
        obj = getattr(obj, part)
    if callable(obj) and not hasattr(obj, "run"):
        obj = obj()  # an app factory
    if not hasattr(obj, "run"):
        raise TypeError(f"{target} is not an ackkit App (it has no run())")
    return obj


def run_app(app: Any) -> None:
    """Run an App (blocking, with its own signal handling) or an AsyncApp (asyncio.run)."""
    if inspect.iscoroutinefunction(app.run):
        asyncio.run(app.run())
    else:
        app.run()


def run_workers(
    target: str,
    workers: int,
    url: str | None,
    metrics_port: int | None = None,
    metrics_addr: str = "0.0.0.0",
) -> int:
    """Run `target` in `workers` processes; SIGINT/SIGTERM stop them all gracefully.

    With `metrics_port`, worker i serves its metrics on `metrics_port + i`."""
    cmd = [sys.executable, "-m", "ackkit.cli", "run", target, "--workers", "1"]
    if url:
        cmd += ["--url", url]

    def worker_cmd(i: int) -> list[str]:
        if metrics_port is None:
            return cmd
        return [*cmd, "--metrics-port", str(metrics_port + i), "--metrics-addr", metrics_addr]

    procs = [subprocess.Popen(worker_cmd(i), start_new_session=True) for i in range(workers)]
    stopping = False

    def stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    old = [signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)]
    code = 0
    try:
        while any(p.poll() is None for p in procs):
            for p in procs:
                rc = p.poll()
                if rc not in (None, 0) and not stopping:
                    print(
                        f"ackkit: worker {p.pid} exited with {rc}; stopping the others",
                        file=sys.stderr,
                    )
                    code = rc or 1
                    stop(signal.SIGTERM, None)
            time.sleep(0.1)
    finally:
        for s, h in zip((signal.SIGINT, signal.SIGTERM), old, strict=True):
            signal.signal(s, h)
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
    if not code:
        code = max((p.returncode or 0 for p in procs), default=0)
    return code


def build_cli() -> typer.Typer:
    """The typer application (imports typer and rich)."""
    import typer
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from ._dead_letters import ReplayFilter
    from ._dlq import DeadLetterQueue, safe_error
    from ._queues import SOURCES, QueueSourceError, list_queues

    out = Console()
    err = Console(stderr=True)
    cli = typer.Typer(
        help="ackkit: RabbitMQ acknowledgement tools (dead-letter queues, queue counts, run).",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    dlq = typer.Typer(help="Inspect and replay dead-letter queues.", no_args_is_help=True)
    cli.add_typer(dlq, name="dlq")

    url_opt = typer.Option(DEFAULT_URL, "--url", envvar="AMQP_URL", help="AMQP URL.")

    def fail(msg: str, url: str, code: int = 1) -> typer.Exit:
        err.print(f"[red]error:[/red] {escape(_safe(msg, url))}", markup=True, highlight=False)
        return typer.Exit(code)

    def emit_json(data: Any, url: str) -> None:
        print(_safe(json.dumps(data, indent=2, default=str), url))

    @dlq.command("inspect")
    def dlq_inspect(
        queue: str = typer.Argument(..., help="The dead-letter queue, e.g. orders.dlq."),
        limit: int = typer.Option(20, "--limit", "-n", min=0, help="Messages to show (0: all)."),
        as_json: bool = typer.Option(False, "--json", help="JSON instead of a table."),
        url: str = url_opt,
    ) -> None:
        """Count and list dead letters (read and put back: nothing is removed)."""
        try:
            with DeadLetterQueue(url, queue, connection_name="ackkit-cli") as q:
                count = q.count()
                letters = q.inspect(limit or None)
        except Exception as exc:
            raise fail(safe_error(exc, url), url) from None
        if as_json:
            emit_json(
                {"queue": queue, "count": count, "messages": [d.to_dict() for d in letters]},
                url,
            )
            return
        table = Table(title=f"{queue}: {count} message(s)", title_justify="left")
        for col in ("message_id", "reason", "error type", "attempts", "original queue"):
            table.add_column(col, overflow="fold")
        table.add_column("dead-lettered at", no_wrap=True)
        table.add_column("notes", overflow="fold")
        for d in letters:
            # Text cells: a header saying "[red]" is shown as written, never parsed as markup.
            table.add_row(
                *(
                    Text(_safe(str(v), url))
                    for v in (
                        d.message_id or "-",
                        d.reason,
                        d.error_type or "-",
                        "-" if d.attempts is None else d.attempts,
                        d.original_queue or "-",
                        d.dead_lettered_at or "-",
                        "; ".join(d.notes) or "-",
                    )
                )
            )
        out.print(table)
        if len(letters) < count:
            out.print(f"({count - len(letters)} more; --limit 0 shows all)")

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
        url: str = url_opt,
    ) -> None:
        """Publish dead letters back (confirmed) and only then remove them from the DLQ."""
        flt = ReplayFilter(error_type, reason_contains, frozenset(message_id))
        try:
            with DeadLetterQueue(url, queue, connection_name="ackkit-cli") as q:
                report = q.replay(to=to, select=flt, limit=limit or None)
        except Exception as exc:
            raise fail(safe_error(exc, url), url) from None
        if as_json:
            emit_json(report.to_dict(), url)
        else:
            where = ", ".join(f"{n} -> {t}" for t, n in report.targets.items()) or "-"
            out.print(
                f"{queue}: examined {report.examined}, replayed {report.replayed} ({where}), "
                f"left {report.left} (filtered {report.skipped}, no origin {report.no_target}, "
                f"failed {report.failed}); {report.remaining} in the queue now",
                highlight=False,
                markup=False,
            )
            for e in report.errors:
                err.print(_safe(e, url), highlight=False, markup=False)
        if report.failed:
            raise typer.Exit(1)

    @cli.command("queues")
    def queues(
        names: list[str] = typer.Argument(None, help="Only these queues (needed for AMQP)."),  # noqa: B008
        as_json: bool = typer.Option(False, "--json", help="JSON instead of a table."),
        source: str = typer.Option(
            "auto", "--source", help=f"One of {', '.join(SOURCES)} (auto tries them in order)."
        ),
        management_url: str | None = typer.Option(
            None, "--management-url", help="Management API base (default http://HOST:15672)."
        ),
        node: str | None = typer.Option(None, "--node", help="Node name for rabbitmqctl."),
        url: str = url_opt,
    ) -> None:
        """Queue counts (name, ready, unacked, total, consumers) like rabbitmqctl list_queues."""
        if source not in SOURCES:
            raise fail(f"--source must be one of {', '.join(SOURCES)}", url, 2)
        try:
            listing = list_queues(
                url, names or (), source=source, management_url=management_url, node=node
            )
        except (QueueSourceError, Exception) as exc:
            raise fail(safe_error(exc, url), url) from None
        if as_json:
            emit_json({"url": mask_url(url), **listing.to_dict()}, url)
            return
        table = Table(title=f"queues of {mask_url(url)} (source: {listing.source})")
        table.add_column("name", overflow="fold")
        for col in ("ready", "unacked", "total", "consumers"):
            table.add_column(col, justify="right")
        for r in listing.rows:
            table.add_row(
                r.name,
                *("-" if v is None else str(v) for v in (r.ready, r.unacked, r.total, r.consumers)),
            )
        out.print(table)
        for note in listing.notes:
            err.print(_safe(note, url), highlight=False)

    @cli.command("run")
    def run(
        target: str = typer.Argument(..., help="module:app (an App or AsyncApp, or a factory)."),
        workers: int = typer.Option(1, "--workers", "-w", min=1, help="Processes to run."),
        url: str | None = typer.Option(
            None, "--url", help="Override the App's URL (AMQP_URL is left to the app)."
        ),
        metrics_port: int | None = typer.Option(
            None,
            "--metrics-port",
            min=0,
            help="Serve Prometheus metrics on this port (worker i of --workers: port + i).",
        ),
        metrics_addr: str = typer.Option(
            "0.0.0.0", "--metrics-addr", help="Address the metrics server listens on."
        ),
    ) -> None:
        """Run an App until SIGINT/SIGTERM, then shut down gracefully (flush acks, requeue)."""
        if workers > 1:
            raise typer.Exit(run_workers(target, workers, url, metrics_port, metrics_addr))
        try:
            app = load_app(target)
        except Exception as exc:
            raise fail(f"cannot load {target}: {exc}", url or "") from None
        if url:
            app.url = url
        shown = mask_url(str(getattr(app, "url", "")))
        if metrics_port is not None:
            try:
                from .metrics import PrometheusMetrics

                PrometheusMetrics(app).serve(metrics_port, metrics_addr)
            except (ImportError, OSError) as exc:
                raise fail(f"--metrics-port {metrics_port}: {exc}", url or "") from None
            err.print(
                f"ackkit: metrics on http://{metrics_addr}:{metrics_port}/metrics",
                highlight=False,
            )
        err.print(f"ackkit: running {target} ({shown}), pid {os.getpid()}", highlight=False)
        try:
            run_app(app)
        except KeyboardInterrupt:
            pass
        except Exception as exc:
            raise fail(f"{type(exc).__name__}: {exc}", str(getattr(app, "url", ""))) from None

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


if __name__ == "__main__":
    main()
