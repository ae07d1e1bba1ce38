"""The `ackkit` command on a real broker: dlq inspect / replay, queues, run."""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _retry_support import REPO, drain, publish, read_log, wait_until
from typer.testing import CliRunner

from ackkit._core import headers as H
from ackkit.cli import build_cli, main
from tests._users import user as broker_user

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-Pw"


def cli(*args: str, url: str) -> Any:
    result = CliRunner().invoke(build_cli(), list(args), env={"AMQP_URL": url, "COLUMNS": "200"})
    return result


@pytest.fixture(scope="module")
def secret_url(rabbitmq: Any) -> Iterator[str]:
    """The broker URL with a user whose password must never be printed."""
    made = broker_user(rabbitmq, "ackkit_cli", SECRET, configure=".*", write=".*", read=".*")
    try:
        url = made.__enter__()
    except Exception as exc:
        pytest.skip(f"cannot add a user on this broker: {exc}")
    yield url
    with contextlib.suppress(Exception):
        made.__exit__(None, None, None)


def dead_letters(url: str, q: str, n: int) -> None:
    publish(url, f"{q}.dlq", b"", declare=True)
    drain(url, f"{q}.dlq")
    publish(url, q, b"", declare=True)
    drain(url, q)
    for i in range(n):
        err = "ValueError" if i % 2 == 0 else "mod.TimeoutError"
        publish(
            url,
            f"{q}.dlq",
            json.dumps({"i": i}),
            message_id=f"m{i}",
            headers={
                H.REASON: f"attempts exhausted (5 of 5) connecting to amqp://u:{SECRET}@h/",
                H.ERROR_TYPE: err,
                H.ATTEMPTS: 5,
                H.ORIGINAL_QUEUE: q,
                H.DEAD_LETTERED_AT: "2026-01-01T00:00:00.000+00:00",
            },
        )


def test_dlq_inspect_table_and_json(rabbitmq: Any, fresh_queue: str, secret_url: str) -> None:
    q = fresh_queue
    dead_letters(rabbitmq.url, q, 3)
    r = cli("dlq", "inspect", f"{q}.dlq", "--format", "table", url=secret_url)
    assert r.exit_code == 0, r.output
    assert f"{q}.dlq: 3 message(s)" in r.output
    for col in ("message_id", "reason", "error", "attempts", "dead-lettered"):
        assert col in r.output
    assert "m0" in r.output and "ValueError" in r.output
    assert SECRET not in r.output
    r = cli("dlq", "inspect", f"{q}.dlq", "--json", "--limit", "2", url=secret_url)
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["count"] == 3
    assert [m["message_id"] for m in data["messages"]] == ["m0", "m1"]
    m0 = data["messages"][0]
    assert (m0["error_type"], m0["attempts"], m0["original_queue"]) == ("ValueError", 5, q)
    assert SECRET not in r.output and "***" in m0["reason"]
    rabbitmq.wait_for(f"{q}.dlq", ready=3, unacked=0)  # nothing removed


def test_dlq_replay_with_filters(rabbitmq: Any, fresh_queue: str, secret_url: str) -> None:
    q = fresh_queue
    dead_letters(rabbitmq.url, q, 5)
    r = cli("dlq", "replay", f"{q}.dlq", "--error-type", "TimeoutError", "--json", url=secret_url)
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert (report["examined"], report["replayed"], report["skipped"]) == (5, 2, 3)
    assert report["targets"] == {q: 2}
    rabbitmq.wait_for(q, ready=2)
    r = cli("dlq", "replay", f"{q}.dlq", "--message-id", "m4", "--to", q, url=secret_url)
    assert r.exit_code == 0, r.output
    assert "replayed 1" in r.output and "2 in the queue now" in r.output
    r = cli(
        "dlq",
        "replay",
        f"{q}.dlq",
        "--reason-contains",
        "EXHAUSTED",
        "--limit",
        "1",
        url=secret_url,
    )
    assert r.exit_code == 0 and "replayed 1" in r.output
    rabbitmq.wait_for(q, ready=4)
    rabbitmq.wait_for(f"{q}.dlq", ready=1, unacked=0)
    assert SECRET not in r.output


def test_dlq_replay_to_missing_queue_fails_and_keeps_the_message(
    rabbitmq: Any, fresh_queue: str
) -> None:
    q = fresh_queue
    dead_letters(rabbitmq.url, q, 1)
    r = cli("dlq", "replay", f"{q}.dlq", "--to", f"{q}.nowhere", url=rabbitmq.url)
    assert r.exit_code == 1
    assert "failed 1" in r.output and "Unroutable" in r.output
    rabbitmq.wait_for(f"{q}.dlq", ready=1, unacked=0)


def test_errors_are_clear_and_masked(rabbitmq: Any, fresh_queue: str, secret_url: str) -> None:
    r = cli("dlq", "inspect", f"{fresh_queue}.dlq", url=secret_url)
    assert r.exit_code == 1
    assert "NOT_FOUND" in r.output or "404" in r.output
    bad = secret_url.replace(SECRET, SECRET + "x")
    r = cli("dlq", "inspect", "whatever", url=bad)
    assert r.exit_code == 1
    assert SECRET not in r.output and "error" in r.output


def test_queues_json_names_the_source(rabbitmq: Any, fresh_queue: str, secret_url: str) -> None:
    q = fresh_queue
    publish(rabbitmq.url, q, b"x", declare=True)
    r = cli("queues", q, f"{q}.missing", "--json", url=secret_url)
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["source"] in ("management", "rabbitmqctl", "amqp")
    assert SECRET not in r.output and "***" in data["url"]
    rows = {row["name"]: row for row in data["queues"]}
    assert rows[q]["ready"] == 1 and rows[q]["consumers"] == 0
    if data["source"] != "amqp":
        assert rows[q]["unacked"] == 0 and rows[q]["total"] == 1
    assert rows[f"{q}.missing"]["ready"] is None


def test_queues_over_amqp(rabbitmq: Any, fresh_queue: str) -> None:
    q = fresh_queue
    publish(rabbitmq.url, q, b"x", declare=True)
    r = cli("queues", "--source", "amqp", url=rabbitmq.url)
    assert r.exit_code == 1 and "name the queues" in r.output
    r = cli("queues", q, "--source", "amqp", "--format", "table", url=rabbitmq.url)
    assert r.exit_code == 0, r.output
    assert "source: amqp" in r.output and q in r.output


class _FakeManagement(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str]] = []

    def do_GET(self) -> None:
        _FakeManagement.seen.append((self.path, self.headers.get("Authorization", "")))
        body = json.dumps(
            [
                {
                    "name": "orders",
                    "messages_ready": 0,
                    "messages_unacknowledged": 5,
                    "messages": 5,
                    "consumers": 1,
                },
                {"name": "orders.dlq", "messages_ready": 2, "messages": 2, "consumers": 0},
            ]
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_queues_through_the_management_api() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeManagement)
    th = threading.Thread(target=server.serve_forever, daemon=True)
    th.start()
    try:
        mgmt = f"http://127.0.0.1:{server.server_address[1]}"
        url = f"amqp://alice:{SECRET}@127.0.0.1:5672/prod"
        r = cli("queues", "--json", "--management-url", mgmt, url=url)
        assert r.exit_code == 0, r.output
        data = json.loads(r.output)
        assert data["source"] == "management"
        assert data["queues"][0] == {
            "name": "orders",
            "ready": 0,
            "unacked": 5,
            "total": 5,
            "consumers": 1,
        }
        assert data["queues"][1]["unacked"] is None
        path, auth = _FakeManagement.seen[-1]
        assert path.startswith("/api/queues/prod?")
        assert base64.b64decode(auth.split()[1]).decode() == f"alice:{SECRET}"
        assert SECRET not in r.output
        r = cli("queues", "--management-url", mgmt, "--format", "table", url=url)
        assert "source: management" in r.output and "orders.dlq" in r.output
    finally:
        server.shutdown()
        server.server_close()


ROW = {"name": "a", "messages_ready": 1, "messages_unacknowledged": 2, "messages": 3}
FAKE_CTL = f"""#!/bin/sh
case "$*" in
  *status*) echo '{{"listeners": [{{"port": 5672, "protocol": "amqp"}}]}}' ;;
  *list_queues*) echo '[{json.dumps({**ROW, "consumers": 4})}]' ;;
esac
"""


def test_queues_through_rabbitmqctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctl = tmp_path / "rabbitmqctl"
    ctl.write_text(FAKE_CTL)
    ctl.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    closed = "http://127.0.0.1:9"  # nothing listens: the management API does not answer
    r = cli("queues", "--json", "--management-url", closed, url="amqp://u:p@localhost:5672/%2f")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["source"] == "rabbitmqctl"
    assert data["queues"] == [{"name": "a", "ready": 1, "unacked": 2, "total": 3, "consumers": 4}]
    assert any("management" in n for n in data["notes"])
    # The management API's failure is not repeated on every listing, unless asked (-v).
    r = cli("queues", "--management-url", closed, url="amqp://u:p@localhost:5672/%2f")
    assert r.exit_code == 0 and "management" not in r.output and "a\t1\t2\t3\t4" in r.output
    r = cli("queues", "-v", "--management-url", closed, url="amqp://u:p@localhost:5672/%2f")
    assert r.exit_code == 0 and "management" in r.output
    # Another node's rabbitmqctl (the URL's port is not among its listeners) is not used.
    r = cli(
        "queues",
        "--json",
        "--source",
        "rabbitmqctl",
        "--management-url",
        closed,
        url="amqp://u:p@localhost:5999/%2f",
    )
    assert r.exit_code == 1 and "--node" in r.output


APP_MODULE = """
import os, json
from ackkit import App, Consumer, Delivery

app = App(os.environ["T_URL"], shutdown_timeout=5)

@app.listener(os.environ["T_QUEUE"], consumer=Consumer(prefetch=5))
def handle(d: Delivery) -> None:
    with open(os.environ["T_LOG"], "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "mid": d.message_id}) + "\\n")
"""

ASYNC_MODULE = """
import os

class FakeAsyncApp:
    url = "amqp://guest:guest@127.0.0.1:5672/%2f"

    async def run(self) -> None:
        with open(os.environ["T_LOG"], "a") as f:
            f.write('{"async": true}\\n')

app = FakeAsyncApp()
"""


def test_run_with_two_workers_and_clean_shutdown(
    rabbitmq: Any, fresh_queue: str, tmp_path: Path
) -> None:
    q = fresh_queue
    (tmp_path / "svc.py").write_text(APP_MODULE)
    log = tmp_path / "log.jsonl"
    publish(rabbitmq.url, q, b"", declare=True)
    drain(rabbitmq.url, q)
    env = {
        **os.environ,
        "T_URL": rabbitmq.url,
        "T_QUEUE": q,
        "T_LOG": str(log),
        "PYTHONPATH": str(REPO),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "ackkit.cli", "run", "svc:app", "--workers", "2"],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        rabbitmq.wait_for(q, consumers=2, timeout=30)
        for i in range(20):
            publish(rabbitmq.url, q, json.dumps({"i": i}), message_id=f"m{i}")
        assert wait_until(lambda: len(read_log(log)) >= 20, timeout=15)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "running svc:app" in err and "guest:***@" in err
    rabbitmq.wait_for(q, ready=0, unacked=0, consumers=0)
    assert sorted(e["mid"] for e in read_log(log)) == sorted(f"m{i}" for i in range(20))


def test_run_async_app_with_asyncio(tmp_path: Path) -> None:
    (tmp_path / "asvc.py").write_text(ASYNC_MODULE)
    log = tmp_path / "log.jsonl"
    env = {**os.environ, "T_LOG": str(log), "PYTHONPATH": str(REPO)}
    res = subprocess.run(
        [sys.executable, "-m", "ackkit.cli", "run", "asvc:app"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    assert read_log(log) == [{"async": True}]


ASYNC_APP_MODULE = """
import os, json
from ackkit import AsyncApp, Consumer, Delivery

app = AsyncApp(os.environ["T_URL"], shutdown_timeout=5)

@app.listener(os.environ["T_QUEUE"], consumer=Consumer(prefetch=5))
async def handle(d: Delivery) -> None:
    with open(os.environ["T_LOG"], "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "mid": d.message_id}) + "\\n")
"""


def test_run_a_real_async_app_until_sigterm(
    rabbitmq: Any, fresh_queue: str, tmp_path: Path
) -> None:
    pytest.importorskip("aio_pika")
    q = fresh_queue
    (tmp_path / "aapp.py").write_text(ASYNC_APP_MODULE)
    log = tmp_path / "log.jsonl"
    publish(rabbitmq.url, q, b"", declare=True)
    drain(rabbitmq.url, q)
    env = {**os.environ, "T_URL": rabbitmq.url, "T_QUEUE": q, "T_LOG": str(log)}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ackkit.cli", "run", "aapp:app"],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        rabbitmq.wait_for(q, consumers=1, timeout=30)
        for i in range(5):
            publish(rabbitmq.url, q, json.dumps({"i": i}), message_id=f"m{i}")
        assert wait_until(lambda: len(read_log(log)) >= 5, timeout=15)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    rabbitmq.wait_for(q, ready=0, unacked=0, consumers=0)


def test_run_reports_a_bad_target(tmp_path: Path) -> None:
    r = CliRunner().invoke(build_cli(), ["run", "no_such_module_xyz:app"])
    assert r.exit_code == 1 and "cannot load" in r.output


def test_main_without_typer_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "typer", None)
    with pytest.raises(SystemExit) as info:
        main(["queues"])
    assert info.value.code == 2
    assert "pip install 'ackkit[cli]'" in capsys.readouterr().err


def test_console_script_is_installed() -> None:
    exe = Path(sys.executable).with_name("ackkit")
    res = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0
    assert "dlq" in res.stdout and "queues" in res.stdout and "run" in res.stdout


def test_cli_module_is_importable_without_typer() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["typer"] = None
        sys.modules["rich"] = None
        import ackkit.cli
        print("ok")
        """
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert res.stdout.strip() == "ok", res.stderr
