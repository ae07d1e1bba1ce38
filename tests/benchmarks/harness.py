"""The benchmark harness: pre-fill, run each case in a fresh process, verify, report.

``python -m tests.benchmarks --help`` for the options; cases live in
:mod:`tests.benchmarks.cases` (the protocol is documented there).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import json
import os
import platform
import secrets
import selectors
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from . import broker
from .cases import BODY_SIZE, LOAD_ERRORS, Case, CaseUnavailable, load_all
from .worker import HANDSHAKE

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2f"
DEFAULT_MESSAGES = 50_000
DEFAULT_ROUNDS = 3
QUICK_MESSAGES = 10_000
QUICK_ROUNDS = 1
SETTLE_S = 0.5  # pause between pre-fill and the timed call
HANDSHAKE_TIMEOUT_S = 60.0
KILL_GRACE_S = 30.0
NOTE_WIDTH = 30  # reasons are cut in the table; the JSON has them in full

#: (numerator, denominator, target): the ratios tracked over time.
RATIOS: tuple[tuple[str, str, float], ...] = (
    ("ackkit.sync.auto", "pika.batched", 0.8),
    ("ackkit.async.auto", "aiopika.batched", 0.9),
    ("ackkit.async.auto", "faststream.default", 5.0),
    ("ackkit.deadletter", "publish.confirm", 0.8),
    ("spark.ackkit", "pika.batched", 0.5),
    ("spark.ackkit.steady", "pika.batched", 0.8),
    ("spark.ackkit.steady.shards1", "pika.batched", 0.8),
    ("spark.ackkit.steady.shards2", "pika.batched", 0.8),
    ("spark.ackkit.steady.shards4", "pika.batched", 0.8),
    ("ackkit.inbox.batch", "ackkit.inbox", 5.0),
)

#: (ackkit case, reference case, goal) on CPU per message: reference / ackkit, so 1.0
#: means ackkit costs what the reference costs (the steady figure on a shared machine,
#: where the msgs/s of one round swing).
CPU_RATIOS: tuple[tuple[str, str, float], ...] = (
    ("ackkit.sync.auto", "pika.batched", 0.9),
    ("ackkit.sync.manual", "pika.batched", 0.9),
    ("ackkit.async.auto", "aiopika.batched", 1.0),
    ("ackkit.async.auto", "faststream.default", 5.0),
    ("ackkit.deadletter", "publish.confirm", 0.9),
    ("ackkit.inbox", "pika.psycopg", 0.9),
)

Status = Literal["ok", "invalid", "error", "n/a"]

_PACKAGE = __package__ or "tests.benchmarks"
_HERE = Path(__file__).resolve().parent
#: Directory to put on sys.path so that ``_PACKAGE`` imports (tests/.. or tests/).
_IMPORT_ROOT = _HERE.parents[len(_PACKAGE.split(".")) - 1]
_REPO_ROOT = _HERE.parents[1]


@dataclass
class Config:
    url: str
    cases: list[str]
    messages: int = DEFAULT_MESSAGES
    rounds: int = DEFAULT_ROUNDS
    json_path: Path | None = None
    plot_path: Path | None = None
    keep_queues: bool = False
    logs_dir: Path | None = None
    quick: bool = False
    progress: bool = True


@dataclass
class RunResult:
    case: str
    round: int
    queue: str
    status: Status
    msgs_per_s: float | None = None
    wall_s: float | None = None
    cpu_s: float | None = None
    cpu_us_per_msg: float | None = None
    # voluntary context switches of the worker process per message (threads waiting on
    # each other: the hand-off's cost that CPU time alone hides)
    switches_per_msg: float | None = None
    # the machine's 1-minute load average when the run ended; `busy`: above its CPUs
    load: float | None = None
    busy: bool = False
    reason: str | None = None
    retried: bool = False
    log_tail: list[str] = field(default_factory=list)


# -- running one case ------------------------------------------------------------------


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(_IMPORT_ROOT), str(_REPO_ROOT)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _read_handshake(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """Return (word, rest) of the worker's handshake line, ("eof", "") if none came."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout", f"no handshake within {timeout:.0f}s"
            if not sel.select(remaining):
                continue
            line = proc.stdout.readline()
            if not line:
                return "eof", "worker exited before the handshake"
            if line.startswith(HANDSHAKE):
                word, _, rest = line[len(HANDSHAKE) :].strip().partition(" ")
                return word, rest


def _tail(path: Path, lines: int = 12) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def queue_name(case_id: str, round_no: int) -> str:
    return f"bench.{case_id}.r{round_no}.{secrets.token_hex(3)}"


def run_one(
    bench_case: Case,
    url: str,
    n_messages: int,
    round_no: int,
    workdir: Path,
    keep_queue: bool = False,
    phase: Any = None,
) -> RunResult:
    """Run ``bench_case`` once in a fresh worker process; verify and clean up."""
    queue = queue_name(bench_case.id, round_no)
    run = RunResult(case=bench_case.id, round=round_no, queue=queue, status="error")
    result_path = workdir / f"{queue}.json"
    log_path = workdir / f"{queue}.log"
    say = phase if callable(phase) else (lambda _text: None)
    touched_broker = False

    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                f"{_PACKAGE}.worker",
                "--module",
                bench_case.module,
                "--case",
                bench_case.id,
                "--url",
                url,
                "--queue",
                queue,
                "--messages",
                str(n_messages),
                "--result",
                str(result_path),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            cwd=_REPO_ROOT,
            env=_worker_env(),
        )
        try:
            say("starting worker")
            # A case with a long timeout_s (Spark: JVM start and a warm-up query in its
            # `available` hook) may take a quarter of it to be ready.
            handshake = max(HANDSHAKE_TIMEOUT_S, (bench_case.timeout_s or 0) / 4)
            word, rest = _read_handshake(proc, handshake)
            if word == "n/a":
                run.status, run.reason = "n/a", rest
                return run
            if word != "ready":
                run.reason = f"worker {word}: {rest}"
                run.log_tail = _tail(log_path)
                return run

            say("pre-fill" if bench_case.prefill else "declare queue")
            touched_broker = True
            setup = bench_case.setup or (
                broker.default_setup if bench_case.prefill else broker.empty_setup
            )
            try:
                setup(url, queue, n_messages)
            except CaseUnavailable as exc:
                run.status, run.reason = "n/a", str(exc)
                return run
            time.sleep(SETTLE_S)

            say("running")
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.close()
            hard_limit = bench_case.timeout_for(n_messages) + KILL_GRACE_S
            try:
                proc.wait(timeout=hard_limit)
            except subprocess.TimeoutExpired:
                run.reason = f"killed after {hard_limit:.0f}s"
                run.log_tail = _tail(log_path)
                return run

            try:
                outcome: dict[str, Any] = json.loads(result_path.read_text())
            except (OSError, ValueError):
                run.reason = f"worker exited with {proc.returncode} and no result"
                run.log_tail = _tail(log_path)
                return run
            run.wall_s = outcome.get("wall_s")
            run.cpu_s = outcome.get("cpu_s")
            if outcome.get("status") == "n/a":
                run.status, run.reason = "n/a", outcome.get("reason")
                return run
            if outcome.get("status") != "ok":
                run.reason = outcome.get("reason") or "case failed"
                run.log_tail = _tail(log_path)
                return run
            if outcome.get("measured_s"):
                # A case that times its own window (steady state): its messages / seconds.
                run.msgs_per_s = outcome["measured_messages"] / outcome["measured_s"]
            elif run.wall_s and run.wall_s > 0:
                run.msgs_per_s = n_messages / run.wall_s
            if run.cpu_s is not None and n_messages:
                run.cpu_us_per_msg = run.cpu_s * 1e6 / n_messages
            if outcome.get("switches") is not None and n_messages:
                run.switches_per_msg = outcome["switches"] / n_messages
            load = _loadavg()
            if load:
                run.load = load[0]
                run.busy = load[0] > (os.cpu_count() or 1)

            say("verifying")
            check = bench_case.check or broker.check_drained
            problem = check(url, queue, n_messages)
            run.status, run.reason = ("invalid", problem) if problem else ("ok", None)
            return run
        except Exception as exc:
            run.status, run.reason = "error", f"harness: {type(exc).__name__}: {exc}"
            return run
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None and not pipe.closed:
                    with contextlib.suppress(OSError):
                        pipe.close()
            if touched_broker and not keep_queue:
                with contextlib.suppress(Exception):
                    (bench_case.cleanup or broker.default_cleanup)(url, queue, n_messages)


# -- aggregation -----------------------------------------------------------------------


def summarize(bench_case: Case, runs: list[RunResult]) -> dict[str, Any]:
    valid = [r for r in runs if r.status == "ok" and r.msgs_per_s is not None]
    rates = [r.msgs_per_s for r in valid if r.msgs_per_s is not None]
    cpus = [r.cpu_us_per_msg for r in valid if r.cpu_us_per_msg is not None]
    switches = [r.switches_per_msg for r in valid if r.switches_per_msg is not None]
    if any(r.status == "n/a" for r in runs):
        status = "n/a"
    elif not valid:
        status = "failed"
    elif len(valid) < len(runs):
        status = "partial"
    else:
        status = "ok"
    reasons = [r.reason for r in runs if r.reason]
    return {
        "description": bench_case.description,
        "status": status,
        "median": statistics.median(rates) if rates else None,
        "min": min(rates) if rates else None,
        "max": max(rates) if rates else None,
        "cpu_us_per_msg": statistics.median(cpus) if cpus else None,
        # (max - min) / median of msgs/s: how far one round is from another
        "spread": round((max(rates) - min(rates)) / statistics.median(rates), 3)
        if len(rates) > 1 and statistics.median(rates)
        else None,
        "busy_runs": sum(r.busy for r in runs),
        "switches_per_msg": statistics.median(switches) if switches else None,
        "valid_runs": len(valid),
        "reason": reasons[0] if reasons else None,
        "runs": [asdict(r) for r in runs],
    }


def ratio_key(num: str, den: str) -> str:
    return f"{num}/{den}"


def compute_ratios(cases: dict[str, dict[str, Any]], cpu: bool = False) -> dict[str, float | None]:
    """Median msgs/s of ackkit / of the reference, for each of `RATIOS`; with `cpu`, CPU
    per message of the reference / of ackkit, for each of `CPU_RATIOS` (both: higher is
    better for ackkit)."""
    ratios: dict[str, float | None] = {}
    field = "cpu_us_per_msg" if cpu else "median"
    for num, den, _goal in CPU_RATIOS if cpu else RATIOS:
        a = (cases.get(num) or {}).get(field)
        b = (cases.get(den) or {}).get(field)
        if cpu:
            a, b = b, a
        ratios[ratio_key(num, den)] = round(a / b, 4) if a and b else None
    return ratios


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def collect_meta(cfg: Config) -> dict[str, Any]:
    try:
        info = broker.broker_info(cfg.url)
    except Exception as exc:
        info = {"product": "", "version": f"unknown ({type(exc).__name__})"}
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "loadavg_start": _loadavg(),
        "broker": info.get("version"),
        "broker_product": info.get("product"),
        "url": redact(cfg.url),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "machine": {
            "nproc": os.cpu_count(),
            "cpu_model": _cpu_model(),
            "platform": platform.platform(),
        },
        "messages": cfg.messages,
        "rounds": cfg.rounds,
        "body_size": BODY_SIZE,
        "quick": cfg.quick,
        "libraries": {
            d: _version(d) for d in ("pika", "aio-pika", "faststream", "kombu", "ackkit")
        },
    }


# -- output ----------------------------------------------------------------------------


def _num(value: float | None, fmt: str = "{:,.0f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def results_table(report: dict[str, Any]) -> Table:
    table = Table(
        title="msgs/s, CPU µs and voluntary context switches per message, "
        f"{report['meta']['messages']:,} messages x {report['meta']['rounds']} round(s), "
        "fresh process per run"
    )
    table.add_column("case", no_wrap=True, min_width=19)
    for name in ("median", "min", "max", "µs CPU", "csw/msg"):
        table.add_column(name, justify="right", no_wrap=True, min_width=6)
    table.add_column("ok", justify="right", no_wrap=True)
    table.add_column("note")
    for case_id, res in report["cases"].items():
        status = res["status"]
        style = {"ok": "", "partial": "yellow", "failed": "red", "n/a": "dim"}[status]
        note = "" if status == "ok" else (res.get("reason") or status)
        if len(note) > NOTE_WIDTH:
            note = note[: NOTE_WIDTH - 1] + "…"
        table.add_row(
            case_id,
            _num(res["median"]),
            _num(res["min"]),
            _num(res["max"]),
            _num(res["cpu_us_per_msg"], "{:,.1f}"),
            _num(res.get("switches_per_msg"), "{:.3f}"),
            "n/a" if status == "n/a" else f"{res['valid_runs']}/{len(res['runs'])}",
            note,
            style=style,
        )
    return table


def ratios_table(report: dict[str, Any], cpu: bool = False) -> Table:
    """The msgs/s ratios (median / median) against their targets; with `cpu`, the CPU
    per message ratios (reference / ackkit) against their goals."""
    title = "CPU ratios (reference / ackkit, CPU per message)" if cpu else "ratios"
    table = Table(title=title if cpu else f"{title} (median / median)")
    table.add_column("ratio")
    table.add_column("value", justify="right")
    table.add_column("goal" if cpu else "target", justify="right")
    table.add_column("", justify="center")
    targets = report["cpu_ratio_goals" if cpu else "ratio_targets"]
    for key, value in report["cpu_ratios" if cpu else "ratios"].items():
        target = targets[key]
        if value is None:
            mark, style = "n/a", "dim"
        elif value >= target:
            mark, style = "met", "green"
        else:
            mark, style = "below", "red"
        table.add_row(key, _num(value, "{:.2f}"), f"{target:g}", mark, style=style)
    return table


def _run_line(run: RunResult) -> str:
    if run.status == "n/a":
        return f"[dim]r{run.round} {run.case}: n/a ({run.reason})[/dim]"
    if run.status == "error":
        return f"[red]r{run.round} {run.case}: ERROR {run.reason}[/red]"
    text = (
        f"r{run.round} {run.case}: {_num(run.msgs_per_s)} msg/s, "
        f"{_num(run.cpu_us_per_msg, '{:,.1f}')} µs CPU/msg"
    )
    if run.busy:
        text += f" (load {run.load:.1f}: busy)"
    if run.status == "invalid":
        return f"[yellow]{text} INVALID: {run.reason}[/yellow]"
    return text


# -- main loop -------------------------------------------------------------------------


def select_cases(wanted: Sequence[str] | None, console: Console | None = None) -> list[Case]:
    registry = load_all()
    for module, error in LOAD_ERRORS.items():
        (console or Console(stderr=True)).print(
            f"[red]case module {module} failed to import, its cases are missing: {error}[/red]"
        )
    if not wanted:
        return list(registry.values())
    unknown = [c for c in wanted if c not in registry]
    if unknown:
        raise SystemExit(f"unknown case(s): {', '.join(unknown)}; known: {', '.join(registry)}")
    return [registry[c] for c in wanted]


def run_benchmarks(cfg: Config, console: Console | None = None) -> dict[str, Any]:
    """Run the configured cases interleaved over rounds; return (and write) the report."""
    console = console or Console()
    selected = select_cases(cfg.cases, console)
    runs: dict[str, list[RunResult]] = {c.id: [] for c in selected}
    unavailable: set[str] = set()
    meta = collect_meta(cfg)
    load = meta["loadavg_start"]
    if load and load[0] > (os.cpu_count() or 1):
        console.print(
            f"[yellow]load average {load[0]:.1f} on {os.cpu_count()} CPUs: expect noisy "
            "numbers (compare ratios within one run, not absolute rates)[/yellow]"
        )

    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not cfg.progress,
        transient=True,
    )
    with tempfile.TemporaryDirectory(prefix="ackkit-bench-") as tmp, progress:
        workdir = Path(tmp)
        if cfg.logs_dir is not None:
            cfg.logs_dir.mkdir(parents=True, exist_ok=True)
            workdir = cfg.logs_dir
        task = progress.add_task("benchmarks", total=len(selected) * cfg.rounds)
        for round_no in range(1, cfg.rounds + 1):
            for bench_case in selected:
                if bench_case.id in unavailable:
                    progress.advance(task)
                    continue

                def phase(text: str, c: Case = bench_case, r: int = round_no) -> None:
                    progress.update(
                        task, description=f"round {r}/{cfg.rounds} [bold]{c.id}[/bold]: {text}"
                    )

                def attempt(c: Case = bench_case, r: int = round_no) -> RunResult:
                    return run_one(
                        c,
                        cfg.url,
                        cfg.messages,
                        r,
                        workdir,
                        keep_queue=cfg.keep_queues,
                        phase=phase,
                    )

                run = attempt()
                if run.status == "error" and (run.reason or "").startswith("harness:"):
                    # Pre-fill / verification failed, not the case: e.g. someone else's
                    # test cut our connection on a shared broker. One more try.
                    progress.console.print(f"[yellow]{_run_line(run)}; retrying[/yellow]")
                    run = attempt()
                    run.retried = True
                runs[bench_case.id].append(run)
                if run.status == "n/a":
                    unavailable.add(bench_case.id)
                progress.console.print(_run_line(run))
                for line in run.log_tail:
                    progress.console.print(Text("    " + line, style="dim"))
                progress.advance(task)

    meta["loadavg_end"] = _loadavg()
    cases = {c.id: summarize(c, runs[c.id]) for c in selected}
    report: dict[str, Any] = {
        "cases": cases,
        "ratios": compute_ratios(cases),
        "ratio_targets": {ratio_key(n, d): t for n, d, t in RATIOS},
        "cpu_ratios": compute_ratios(cases, cpu=True),
        "cpu_ratio_goals": {ratio_key(n, d): g for n, d, g in CPU_RATIOS},
        "meta": meta,
    }
    console.print(results_table(report))
    console.print(ratios_table(report))
    console.print(ratios_table(report, cpu=True))
    busy = {c: r["busy_runs"] for c, r in cases.items() if r.get("busy_runs")}
    if busy:
        console.print(
            f"[yellow]runs that ended with the load average above {os.cpu_count()} CPUs: "
            + ", ".join(f"{c} {n}" for c, n in busy.items())
            + " (their figures are noisier)[/yellow]"
        )

    if cfg.json_path is not None:
        cfg.json_path.parent.mkdir(parents=True, exist_ok=True)
        cfg.json_path.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {cfg.json_path}")
    if cfg.plot_path is not None:
        from .plot import write_plot

        if write_plot(report, cfg.plot_path):
            console.print(f"wrote {cfg.plot_path}")
        else:
            console.print("[dim]matplotlib not importable: no plot[/dim]")
    return report


# -- broker URL ------------------------------------------------------------------------


def _provisioned_url(stack: contextlib.ExitStack, exclusive: bool = False) -> str | None:
    """Ask ``ackkit.testing.provision_broker`` for a broker, if that exists.

    The handle stays open (``stack``) until the benchmarks are done.
    """
    try:
        testing = importlib.import_module("ackkit.testing")
    except Exception:
        return None
    provision = getattr(testing, "provision_broker", None)
    if provision is None:
        return None
    handle: Any = provision(exclusive=True) if exclusive else provision()
    candidates = [handle]
    if hasattr(handle, "__enter__") and hasattr(handle, "__exit__"):
        candidates.insert(0, stack.enter_context(handle))
    for candidate in candidates:
        if isinstance(candidate, str):
            return candidate
        for attr in ("url", "amqp_url"):
            value = getattr(candidate, attr, None)
            if value:
                return str(value)
    return None


def resolve_url(
    explicit: str | None,
    stack: contextlib.ExitStack,
    console: Console,
    own_broker: bool = False,
) -> str | None:
    """--url, else $AMQP_URL, else the local default, else a broker from the test kit."""
    if own_broker:
        try:
            url = _provisioned_url(stack, exclusive=True)
        except Exception as exc:
            console.print(f"[red]could not start a broker node of our own: {exc}[/red]")
            return None
        if url is None:
            console.print("[red]--own-broker needs ackkit.testing.provision_broker[/red]")
        else:
            console.print(f"using a broker node of our own: {redact(url)}")
        return url
    if explicit:
        return explicit
    if os.environ.get("AMQP_URL"):
        return os.environ["AMQP_URL"]
    if broker.reachable(DEFAULT_URL):
        return DEFAULT_URL
    try:
        url = _provisioned_url(stack)
    except Exception as exc:
        console.print(f"[yellow]ackkit.testing.provision_broker failed: {exc}[/yellow]")
        url = None
    if url:
        console.print(f"using a broker from ackkit.testing.provision_broker: {redact(url)}")
        return url
    return DEFAULT_URL


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks",
        description="RabbitMQ consume/ack throughput: raw clients, peers and ackkit.",
    )
    parser.add_argument("--url", help="AMQP URL (default: $AMQP_URL, else local guest)")
    parser.add_argument(
        "--own-broker",
        action="store_true",
        help="start a throwaway broker node (ackkit.testing) so other users of the shared "
        "broker cannot disturb the runs",
    )
    parser.add_argument("--cases", help="comma-separated case ids (default: all)")
    parser.add_argument("--messages", type=int, help=f"per run (default {DEFAULT_MESSAGES:,})")
    parser.add_argument("--rounds", type=int, help=f"interleaved rounds (default {DEFAULT_ROUNDS})")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_MESSAGES:,} messages, {QUICK_ROUNDS} round (unless given explicitly)",
    )
    parser.add_argument("--json", type=Path, dest="json_path", help="write results here")
    parser.add_argument("--plot", type=Path, help="PNG of the ratios (default: next to --json)")
    parser.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    parser.add_argument("--keep-queues", action="store_true", help="do not delete run queues")
    parser.add_argument("--logs", type=Path, help="keep worker logs in this directory")
    parser.add_argument("--no-progress", action="store_true", help="no live progress bar")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    if args.list:
        for bench_case in load_all().values():
            console.print(f"{bench_case.id:22} {bench_case.description}", soft_wrap=True)
        return 0

    messages = args.messages or (QUICK_MESSAGES if args.quick else DEFAULT_MESSAGES)
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS)
    if messages <= 0 or rounds <= 0:
        console.print("[red]--messages and --rounds must be positive[/red]")
        return 2
    plot = None
    if not args.no_plot:
        plot = args.plot or (args.json_path.with_suffix(".png") if args.json_path else None)

    with contextlib.ExitStack() as stack:
        url = resolve_url(args.url, stack, console, own_broker=args.own_broker)
        if url is None:
            return 1
        if not broker.reachable(url):
            console.print(f"[red]no broker answers at {redact(url)}[/red]")
            return 1
        cfg = Config(
            url=url,
            cases=[c.strip() for c in args.cases.split(",") if c.strip()] if args.cases else [],
            messages=messages,
            rounds=rounds,
            json_path=args.json_path,
            plot_path=plot,
            keep_queues=args.keep_queues,
            logs_dir=args.logs,
            quick=args.quick,
            progress=not args.no_progress,
        )
        started = time.monotonic()
        report = run_benchmarks(cfg, console)
        console.print(f"done in {time.monotonic() - started:.0f}s")
    failed = [k for k, v in report["cases"].items() if v["status"] == "failed"]
    return 1 if failed else 0
