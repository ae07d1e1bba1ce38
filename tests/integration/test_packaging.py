"""ackkit as a new user gets it: a wheel, installed into a fresh venv outside the repo.

Builds the wheel from a copy of the source (nothing is written into the
checkout), installs it with `pip install --no-index` into a new venv that
lives in tmp_path, with its dependencies from wheels repacked from this
environment's installed distributions (no network, no download), then runs
the `ackkit` command and a tiny App against the test broker with that venv's
interpreter in isolated mode. About 15-30 s, most of it pip.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
EXTRAS = ("cli",)
SKIP_IN_DIST_INFO = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}


def _pip(*args: str, python: Path | None = None, timeout: float = 240) -> str:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    if python is not None:
        cmd += ["--python", str(python)]
    res = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"pip {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}"
    return res.stdout


# The test kit's provisioning: ackkit-testkit's (testkit/), never in ackkit's wheel.
PROVISIONING = ("_rootfs", "_provider_node", "_provider_chroot", "_node_os", "_node_files")
PROVISIONING += ("_docker_image", "_postgres", "_own", "_proc", "_pg_image", "_provider_pg_docker")


def _build_wheel(tmp: Path, project: str = ".") -> Path:
    """The wheel of ackkit (``project="."``) or of ackkit-testkit (``"testkit"``)."""
    src = tmp / "src"
    if not src.exists():
        src.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(REPO / name, src / name)
        for tree in ("ackkit", "testkit"):
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
            shutil.copytree(REPO / tree, src / tree, ignore=ignore)
    dist = tmp / "dist"
    try:
        offline = Version(md.version("setuptools")) >= Version("77")
    except md.PackageNotFoundError:
        offline = False
    # With a recent enough setuptools here (the `test` extra has it) the build needs no
    # network; otherwise pip fetches the build backend from the package index.
    flags = ["--no-build-isolation", "--no-index"] if offline else []
    _pip("wheel", "--no-deps", *flags, "-w", str(dist), str(src / project))
    (wheel,) = dist.glob("ackkit-*.whl" if project == "." else "ackkit_testkit-*.whl")
    return wheel


def _requirements(dist: str, extras: set[str]) -> list[tuple[str, set[str]]]:
    out = []
    for line in md.requires(dist) or []:
        req = Requirement(line)
        envs = [{"extra": e} for e in extras] or [{"extra": ""}]
        if req.marker is None or any(req.marker.evaluate(env) for env in envs):
            out.append((req.name, set(req.extras)))
    return out


def _dependency_closure(root: str, extras: set[str]) -> list[md.Distribution]:
    """The installed distributions `root[extras]` needs, transitively."""
    found: dict[str, md.Distribution] = {}
    wanted: dict[str, set[str]] = {}
    todo = _requirements(root, extras)
    while todo:
        name, ex = todo.pop()
        key = canonicalize_name(name)
        if key in found and ex <= wanted[key]:
            continue
        wanted[key] = wanted.get(key, set()) | ex
        found[key] = md.distribution(name)
        todo += _requirements(name, ex)
    return list(found.values())


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _repack(dist: md.Distribution, out: Path) -> Path:
    """A wheel of an installed distribution: its files as RECORD lists them (scripts
    outside site-packages and bytecode left out: pip makes its own)."""
    files = [f for f in dist.files or [] if not str(f).startswith("..")]
    info_dir = next(str(f).split("/")[0] for f in files if str(f).endswith(".dist-info/METADATA"))
    tags = [
        line.split(":", 1)[1].strip()
        for line in (dist.read_text("WHEEL") or "").splitlines()
        if line.startswith("Tag:")
    ]
    # a compressed tag set (py2.py3-none-any) covering every tag the wheel declared
    parts = [dict.fromkeys(t.split("-")[i] for t in tags) for i in range(3)] if tags else []
    tag = "-".join(".".join(p) for p in parts) if tags else "py3-none-any"
    name = canonicalize_name(dist.metadata["Name"]).replace("-", "_")
    path = out / f"{name}-{dist.version}-{tag}.whl"
    record: list[str] = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for f in files:
            rel = str(f)
            if "__pycache__" in rel or rel.endswith(".pyc"):
                continue
            if rel.startswith(info_dir + "/") and rel.split("/", 1)[1] in SKIP_IN_DIST_INFO:
                continue
            located = Path(str(f.locate()))
            if not located.is_file():
                continue
            data = located.read_bytes()
            z.writestr(rel, data)
            record.append(f"{rel},sha256={_b64(hashlib.sha256(data).digest())},{len(data)}")
        record.append(f"{info_dir}/RECORD,,")
        z.writestr(f"{info_dir}/RECORD", "\n".join(record) + "\n")
    return path


EXAMPLE = """
import json, os, sys, threading
from pydantic import BaseModel
import ackkit
from ackkit import App, Consumer

url, queue = os.environ["T_URL"], os.environ["T_QUEUE"]
app = App(url, shutdown_timeout=5)
seen = []
done = threading.Event()

class Order(BaseModel):
    id: int

@app.listener(queue, consumer=Consumer(prefetch=10))
def on_order(order: Order) -> None:
    seen.append(order.id)
    if len(seen) == 5:
        done.set()

try:
    import ackkit.metrics
    metrics_hint = ""
except ImportError as exc:
    metrics_hint = str(exc)
from ackkit.tracing import OpenTelemetryTracing
OpenTelemetryTracing(app)  # no opentelemetry here: a no-op

with app.running():
    with ackkit.connect(url) as c:
        for i in range(5):
            c.publish(queue, json.dumps({"id": i}), message_id=f"m{i}")
    assert done.wait(30), seen
stats = app.stats()
heavy = ("prometheus_client", "opentelemetry", "aio_pika", "pyspark")
print(json.dumps({
    "file": ackkit.__file__,
    "seen": sorted(seen),
    "metrics_hint": metrics_hint,
    "loaded": sorted(m for m in sys.modules if m.split(".")[0] in heavy),
    "typed": os.path.exists(os.path.join(os.path.dirname(ackkit.__file__), "py.typed")),
}))
"""


def test_wheel_installs_and_runs_in_a_fresh_venv(
    rabbitmq: Any, fresh_queue: str, tmp_path: Path
) -> None:
    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "ackkit/py.typed" in names
    assert "ackkit/console/templates/base.html" in names  # the console's pages (package data)
    assert "ackkit/metrics.py" in names and "ackkit/testing/plugin.py" in names
    # every module of the checkout ships, the private rooms (ackkit/_app, ...) included
    sources = {p.relative_to(REPO).as_posix() for p in (REPO / "ackkit").rglob("*.py")}
    assert sources - names == set()
    assert not any(
        n.startswith(("tests/", "examples/", "testkit/", "ackkit_testkit")) for n in names
    )
    shipped = {n.removeprefix("ackkit/testing/").removesuffix(".py") for n in names}
    assert not shipped & set(PROVISIONING), "provisioning belongs to ackkit-testkit"
    assert "License-Expression: MIT" in meta
    for extra in ("async", "metrics", "tracing", "cli", "spark", "console"):
        assert f"Provides-Extra: {extra}" in meta

    house = tmp_path / "wheelhouse"
    house.mkdir()
    for dist in _dependency_closure("ackkit", set(EXTRAS)):
        _repack(dist, house)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    spec = f"{wheel}[{','.join(EXTRAS)}]"
    _pip("install", "--no-index", "--find-links", str(house), spec, python=python)

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(T_URL=rabbitmq.url, T_QUEUE=fresh_queue)
    help_ = subprocess.run(
        [str(venv / "bin" / "ackkit"), "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert help_.returncode == 0, help_.stderr
    for command in ("run", "dlq", "queues"):
        assert command in help_.stdout

    script = tmp_path / "example.py"
    script.write_text(EXAMPLE)
    res = subprocess.run(
        [str(python), "-I", str(script)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=90,
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert Path(out["file"]).is_relative_to(venv), out["file"]  # not the checkout
    assert out["seen"] == [0, 1, 2, 3, 4]
    assert "pip install 'ackkit[metrics]'" in out["metrics_hint"]
    assert out["loaded"] == []
    assert out["typed"]
    rabbitmq.wait_for(fresh_queue, ready=0, unacked=0, consumers=0)


OWN_NODE = """
import json, ackkit_testkit
from ackkit.testing import provision_broker
with provision_broker("own") as broker:
    print(json.dumps({"kind": broker.kind, "up": broker.ping(), "kit": ackkit_testkit.__file__}))
"""


def test_testkit_wheel_brings_the_kits_own_nodes(tmp_path: Path) -> None:
    """ackkit-testkit's wheel holds the provisioning, and installed beside ackkit's it
    gives provision_broker("own") its throwaway node again."""
    if shutil.which("rabbitmq-server", path=os.environ.get("PATH", "") + ":/usr/sbin") is None:
        pytest.skip("needs the machine's rabbitmq-server")
    wheel = _build_wheel(tmp_path)
    kit = _build_wheel(tmp_path, "testkit")
    with zipfile.ZipFile(kit) as z:
        names = set(z.namelist())
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert {f"ackkit_testkit/{m}.py" for m in PROVISIONING} <= names
    assert "ackkit_testkit/py.typed" in names
    assert not any(n.startswith("ackkit/") for n in names)
    assert "Requires-Dist: ackkit==" in meta

    house = tmp_path / "wheelhouse"
    house.mkdir()
    for dist in _dependency_closure("ackkit", set()):
        _repack(dist, house)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    _pip("install", "--no-index", "--find-links", str(house), str(wheel), str(kit), python=python)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "AMQP_URL"))}
    env.pop("ACKKIT_TEST_BROKER", None)
    env["ACKKIT_TEST_RABBITMQ"] = "3.10"
    script = tmp_path / "own_node.py"
    script.write_text(OWN_NODE)
    res = subprocess.run(
        [str(python), "-I", str(script)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out == {"kind": "own", "up": True, "kit": out["kit"]}
    assert Path(out["kit"]).is_relative_to(venv), out["kit"]
