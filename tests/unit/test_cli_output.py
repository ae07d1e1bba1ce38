"""The `ackkit` command's output (tables, TSV, JSON), `--version`, `docs` and `run`
options, without a broker (an unreachable one where it matters)."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len

pytest.importorskip("typer")
from typer.testing import CliRunner

import ackkit
from ackkit._app.asyncapi import document, to_yaml
from ackkit.cli import build_cli
from ackkit.cli._output import (
    Column,
    OutputFormat,
    fit_widths,
    resolve,
    table,
    tsv,
)

REPO = Path(__file__).resolve().parents[2]
cells = st.one_of(
    st.none(),
    st.integers(0, 10**9),
    st.text(max_size=60),
    st.sampled_from(["[red]x[/red]", "a\tb\nc", "日本語のキュー名" * 3, "\x1b[31m"]),
)


@given(
    st.lists(st.integers(0, 300), min_size=1, max_size=8).flatmap(
        lambda nat: st.tuples(
            st.just(nat), st.lists(st.integers(1, 20), min_size=len(nat), max_size=len(nat))
        )
    ),
    st.integers(1, 400),
)
def test_widths_fit_and_never_grow(nat_mins: tuple[list[int], list[int]], available: int) -> None:
    nat, mins = nat_mins
    w = fit_widths(nat, mins, available)
    assert len(w) == len(nat) and all(x >= 1 for x in w)
    assert all(x <= max(n, 1) for x, n in zip(w, nat, strict=True))
    if sum(max(n, 1) for n in nat) <= available:
        assert w == [max(n, 1) for n in nat]
    elif len(nat) <= available:
        assert sum(w) <= available


@settings(max_examples=60)
@given(
    st.lists(st.lists(cells, min_size=5, max_size=5), max_size=12),
    st.integers(60, 220),
)
def test_a_table_fits_its_width_with_one_line_per_row(rows: list[list[Any]], width: int) -> None:
    cols = [Column("name", 12), *(Column(c, 5, numeric=True) for c in "abcd")]
    out = table(cols, rows, width)
    lines = out.splitlines()
    assert len(lines) == len(rows) + 2  # header, rule, one line per row
    assert all(cell_len(line) <= width for line in lines), max(map(cell_len, lines))


@given(st.lists(st.lists(cells, min_size=3, max_size=3), max_size=10))
def test_tsv_rows_are_one_line_of_as_many_fields_and_read_back(rows: list[list[Any]]) -> None:
    out = tsv(["a", "b", "c"], rows)
    lines = out.split("\n")[:-1]
    assert len(lines) == len(rows) + 1
    for line, row in zip(lines[1:], rows, strict=True):
        fields = line.split("\t")
        assert len(fields) == 3
        back = [
            re.sub(r"\\(.)", lambda m: {"t": "\t", "n": "\n", "r": "\r"}.get(m[1], m[1]), f)
            for f in fields
        ]
        assert back == ["" if v is None else str(v) for v in row]


def test_auto_is_a_table_on_a_terminal_and_tsv_when_piped() -> None:
    assert resolve(OutputFormat.AUTO, as_json=False, tty=True) is OutputFormat.TABLE
    assert resolve(OutputFormat.AUTO, as_json=False, tty=False) is OutputFormat.TSV
    assert resolve(OutputFormat.TABLE, as_json=True, tty=False) is OutputFormat.JSON


def test_version() -> None:
    r = CliRunner().invoke(build_cli(), ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"ackkit {ackkit.__version__}"


# -- ackkit docs: AsyncAPI 3.0 -------------------------------------------------------------

SERVICE = """
from pydantic import BaseModel
from ackkit import App, Queue, Retry, RetryStrategy
from ackkit.topology import Bind, Exchange, ExchangeType

class Item(BaseModel):
    sku: str

class Order(BaseModel):
    id: int
    items: list[Item]

app = App("amqp://svc:s3cret-pw@rabbit.example:5672/shop")

@app.listener(
    Queue("orders", bind=[("shop", "order.*")]),
    retry=Retry(max_attempts=3, initial_interval=1.0, strategy=RetryStrategy.BROKER),
)
def on_order(order: Order) -> None:
    '''Takes new orders.'''

@app.listener(Queue("audit", bind=Bind(Exchange("events", ExchangeType.FANOUT))), dead_letter=None)
def on_audit(body: bytes) -> None: ...

@app.listener("counts")
def on_count(n: int) -> None: ...
"""

KEY = re.compile(r"^[A-Za-z0-9_.\-]+$")


def check_asyncapi(doc: dict[str, Any]) -> None:
    """The structure AsyncAPI 3.0.0 requires of what ackkit writes (the spec's document,
    channel, operation, message and AMQP binding 0.3.0 objects), every $ref resolving."""
    assert set(doc) <= {
        "asyncapi",
        "id",
        "info",
        "servers",
        "defaultContentType",
        "channels",
        "operations",
        "components",
    }
    assert doc["asyncapi"] == "3.0.0"
    assert isinstance(doc["info"]["title"], str) and isinstance(doc["info"]["version"], str)
    for s in doc["servers"].values():
        assert isinstance(s["host"], str) and s["protocol"] in ("amqp", "amqps")
        assert "/" not in s["host"] and s["pathname"].startswith("/")

    def resolve_ref(ref: str) -> Any:
        assert ref.startswith("#/"), ref
        node: Any = doc
        for part in ref[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "$ref" in node:
                resolve_ref(node["$ref"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(doc)
    channel_fields = {"address", "messages", "title", "summary", "description", "servers"}
    for key, ch in doc["channels"].items():
        assert KEY.match(key), key
        assert set(ch) - {"parameters", "tags", "externalDocs", "bindings"} - channel_fields <= {
            k for k in ch if k.startswith("x-")
        }
        assert ch["address"] is None or isinstance(ch["address"], str)
        for mk, m in ch["messages"].items():
            assert KEY.match(mk) and "$ref" in m
        amqp = ch["bindings"]["amqp"]
        assert amqp["bindingVersion"] == "0.3.0" and amqp["is"] in ("queue", "routingKey")
        if amqp["is"] == "queue":
            assert amqp["queue"]["name"] == ch["address"]
        else:
            assert amqp["exchange"]["type"] in ("topic", "direct", "fanout", "headers", "default")
    for key, op in doc["operations"].items():
        assert KEY.match(key) and op["action"] in ("send", "receive")
        ch_ref = op["channel"]["$ref"]
        assert ch_ref.startswith("#/channels/")
        for m in op["messages"]:  # must be messages of the operation's channel
            assert m["$ref"].startswith(ch_ref + "/messages/")
    for key, m in doc["components"]["messages"].items():
        assert KEY.match(key) and isinstance(m["payload"], dict)
    for key in doc["components"]["schemas"]:
        assert KEY.match(key)


def docs(tmp_path: Path, *args: str) -> Any:
    (tmp_path / "svc_docs.py").write_text(SERVICE)
    sys.path.insert(0, str(tmp_path))
    try:
        return CliRunner().invoke(build_cli(), ["docs", "svc_docs:app", *args])
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("svc_docs", None)


def test_docs_writes_an_asyncapi_3_document_of_the_listeners(tmp_path: Path) -> None:
    r = docs(tmp_path, "--title", "shop", "--app-version", "2.1.0")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    check_asyncapi(doc)
    assert "s3cret-pw" not in r.output
    ch = doc["channels"]
    assert {c["address"] for c in ch.values()} == {
        "orders",
        "orders.dlq",
        "orders.retry.1000ms",
        "orders.retry.2000ms",
        "order.*",
        None,  # the fanout binding: no routing key
        "audit",
        "counts",
        "counts.dlq",
    }
    binding = next(c for c in ch.values() if c["address"] == "order.*")["bindings"]["amqp"]
    assert binding["exchange"]["name"] == "shop" and binding["exchange"]["vhost"] == "shop"
    msgs = doc["components"]["messages"]
    order = msgs["orders_on_order.message"]
    assert order["payload"]["properties"]["items"]["items"] == {"$ref": "#/components/schemas/Item"}
    assert order["description"] == "Takes new orders."
    assert doc["components"]["schemas"]["Item"]["properties"]["sku"]["type"] == "string"
    assert msgs["counts_on_count.message"]["payload"] == {"type": "integer"}
    assert msgs["audit_on_audit.message"]["contentType"] == "application/octet-stream"
    assert "ackkit-error-type" in msgs["orders_on_order.deadLetter"]["headers"]["properties"]
    actions = sorted(op["action"] for op in doc["operations"].values())
    assert actions == ["receive"] * 3 + ["send"] * 4  # 2 DLQs, 2 retry tiers


def test_docs_yaml_is_the_same_document(tmp_path: Path) -> None:
    out = tmp_path / "asyncapi.yaml"
    r = docs(tmp_path, "--format", "yaml", "--output", str(out))
    assert r.exit_code == 0, r.output
    py = shutil.which("python3")
    probe = "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))"
    res = subprocess.run(
        [py or "python3", "-c", probe, str(out)], capture_output=True, text=True, timeout=60
    )
    if res.returncode != 0:
        pytest.skip("no PyYAML next to a python3 on PATH to read the YAML back")
    r2 = docs(tmp_path)
    assert json.loads(res.stdout) == json.loads(r2.output)


@given(
    st.recursive(
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.text(),
            st.floats(allow_nan=False, allow_infinity=False),
        ),
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(), kids, max_size=4),
        max_leaves=20,
    )
)
@settings(max_examples=30, deadline=None)
def test_yaml_of_json_data_reads_back_the_same(data: Any) -> None:
    py = shutil.which("python3")
    probe = "import json, sys, yaml; print(json.dumps(yaml.safe_load(sys.stdin.read())))"
    res = subprocess.run(
        [py or "python3", "-c", probe],
        input=to_yaml({"k": data}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if res.returncode != 0 and "No module named 'yaml'" in res.stderr:
        pytest.skip("no PyYAML next to a python3 on PATH")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == json.loads(json.dumps({"k": data}))


def test_document_of_an_app_in_process() -> None:
    app = ackkit.App("amqps://u:p@h/%2f")

    @app.listener("q")
    def h(d: ackkit.Delivery) -> None: ...

    doc = app.asyncapi()
    check_asyncapi(doc)
    assert doc == document(app)
    assert doc["servers"]["rabbitmq"] == {"host": "h:5671", "protocol": "amqps", "pathname": "/"}


# -- ackkit run ----------------------------------------------------------------------------

FAKE_APP = """
import os
from ackkit import App

app = App("amqp://guest:guest@127.0.0.1:1/%2f")

@app.listener("t.cli.run")
def handle(body: bytes) -> None: ...
"""


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)


def run_cmd(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    (tmp_path / "svc_run.py").write_text(FAKE_APP)
    import os

    e = {k: v for k, v in os.environ.items() if k != "AMQP_URL"}
    e.update(env or {}, PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}")
    start = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "ackkit.cli", "run", "svc_run:app", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=e,
        cwd=tmp_path,
    )
    return res, time.monotonic() - start


def test_run_gives_up_after_the_startup_timeout_and_reads_amqp_url(tmp_path: Path) -> None:
    port = _closed_port()
    url = f"amqp://u:pw-s3cret@127.0.0.1:{port}/%2f"
    res, took = run_cmd(tmp_path, "--startup-timeout", "2", env={"AMQP_URL": url})
    assert res.returncode == 1
    assert took < 20, took  # the app's own default is 60 s
    assert f"127.0.0.1:{port}" in res.stderr  # AMQP_URL, not the app's port 1
    assert "within 2.0 s" in res.stderr and "pw-s3cret" not in res.stderr
    # the default log format: time and level on every ackkit line
    lines = [ln for ln in res.stderr.splitlines() if " ackkit" in ln and "WARNING" in ln]
    assert lines and all(
        re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ WARNING", ln) for ln in lines
    )
    assert "still running" not in res.stderr
    assert " INFO    pika" not in res.stderr  # the client's chatter: WARNING and up only


def test_run_log_level_and_bad_options(tmp_path: Path) -> None:
    port = _closed_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/%2f"
    res, _ = run_cmd(tmp_path, "--startup-timeout", "1", "--log-level", "error", "--url", url)
    assert res.returncode == 1 and "WARNING" not in res.stderr
    res, _ = run_cmd(tmp_path, "--log-level", "chatty")
    assert res.returncode == 2 and "--log-level" in res.stderr
    res, _ = run_cmd(tmp_path, "--startup-timeout", "0")
    assert res.returncode == 2


def test_startup_timeout_is_set_on_apps_with_frozen_settings_or_attributes() -> None:
    import dataclasses

    from ackkit.cli._run import set_startup_timeout

    @dataclasses.dataclass(frozen=True)
    class Settings:
        url: str = "amqp://"
        startup_timeout: float = 60.0

    class Frozen:
        settings = Settings()

    a = Frozen()
    set_startup_timeout(a, 2.5)
    assert a.settings == Settings(startup_timeout=2.5)
    b = ackkit.App()
    set_startup_timeout(b, 3.0)
    assert b.startup_timeout == 3.0
