"""A Spark standalone cluster on loopback for tests: a master and workers, each a JVM.

    with SparkCluster(workdir, workers=2) as cluster:
        conf = cluster.session_conf(executor_env={"PYTHONPATH": repo})
        spark = spark_session("app", conf=conf)      # or a driver subprocess given `conf`
        cluster.wait_executors(2)                     # the application's executor JVMs
        cluster.kill_executor(cluster.executors()[0]) # SIGKILL one; the worker starts another

Started from pip's pyspark (`bin/spark-class`, no download). Every daemon binds
127.0.0.1 on free ports and runs in a process group of its own with a scrubbed
environment: executors see what a real cluster's would (the worker's machine setup, e.g.
PYSPARK_PYTHON) plus what the application sends (`spark.executorEnv.*`), never the test
process's variables, so code that only works because driver and executor share a
process or an environment fails here. Each worker has 1 core and little memory;
`stop()` (also on failure, via the context manager) kills the daemons, their executors
and the executors' Python workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

LOOPBACK = "127.0.0.1"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
# The machine's own settings a worker keeps; everything else of the test process is left out.
KEEP_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "JAVA_HOME", "TMPDIR", "USER")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


@dataclass(frozen=True)
class Executor:
    """One executor JVM (CoarseGrainedExecutorBackend) found under a worker."""

    pid: int
    worker: int
    """Index of the worker that launched it."""
    app_id: str
    executor_id: str
    started: int
    """Its start time in clock ticks (see `alive`)."""


@dataclass(frozen=True)
class _Proc:
    ppid: int
    started: int
    """Start time (clock ticks after boot): with the pid, names one process for good."""
    cmd: list[str]


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after "pid (comm)"; None when gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # comm may hold spaces and parentheses
    return None if fields[0] == "Z" else fields


def _proc_table() -> dict[int, _Proc]:
    """Every living process visible in /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat(entry)
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if fields is not None:
            args = [c.decode(errors="replace") for c in cmd if c]
            out[int(entry)] = _Proc(int(fields[1]), int(fields[19]), args)
    return out


def descendants(pid: int, table: dict[int, _Proc] | None = None) -> list[int]:
    """Every living process below `pid`."""
    table = _proc_table() if table is None else table
    children: dict[int, list[int]] = {}
    for p, info in table.items():
        children.setdefault(info.ppid, []).append(p)
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def alive(pid: int, started: int | None = None) -> bool:
    """Whether `pid` runs (and is still the process that started at `started`)."""
    fields = _stat(pid)
    return fields is not None and (started is None or int(fields[19]) == started)


def _arg(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1] if name in cmd[:-1] else ""


class SparkCluster:
    """A standalone master and `workers` workers (1 core each), started on construction."""

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        *,
        workers: int = 2,
        worker_memory: str = "1g",
        daemon_memory: str = "256m",
        timeout: float = 120.0,
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.home = spark_home()
        self._procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []
        self.worker_pids: list[int] = []
        self._seen: dict[int, int] = {}  # executors and their Python workers seen (pid -> start)
        self.left: dict[int, int] = {}
        """Processes of the cluster still alive after `stop()` (pid -> start time)."""
        conf_dir = self.workdir / "conf"  # empty: no spark-env.sh / spark-defaults.conf
        conf_dir.mkdir(exist_ok=True)
        self._env = {k: os.environ[k] for k in KEEP_ENV if k in os.environ}
        self._env.update(
            SPARK_HOME=self.home,
            SPARK_CONF_DIR=str(conf_dir),
            SPARK_LOCAL_IP=LOOPBACK,  # web UIs and RPC bind loopback
            SPARK_DAEMON_MEMORY=daemon_memory,
            # The daemons mostly wait: one GC thread, no optimising JIT (less CPU at start).
            SPARK_DAEMON_JAVA_OPTS="-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
            # No REST submission server: it listens on a fixed port (6066) by default.
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
            SPARK_LOG_DIR=str(self.workdir / "logs"),
            # What a cluster's spark-env.sh would say: the Python with ackkit[spark].
            PYSPARK_PYTHON=sys.executable,
        )
        self.port, self.ui_port = free_port(), free_port()
        self.master_url = f"spark://{LOOPBACK}:{self.port}"
        try:
            self._start(
                "master",
                "org.apache.spark.deploy.master.Master",
                ["--host", LOOPBACK, "--port", str(self.port), "--webui-port", str(self.ui_port)],
            )
            self._wait(lambda st: True, timeout, "the master's web UI")
            for i in range(workers):
                work = self.workdir / f"worker-{i}"
                local = self.workdir / f"local-{i}"
                work.mkdir(exist_ok=True)
                local.mkdir(exist_ok=True)
                proc = self._start(
                    f"worker-{i}",
                    "org.apache.spark.deploy.worker.Worker",
                    [
                        self.master_url,
                        *("--host", LOOPBACK, "--port", str(free_port())),
                        *("--webui-port", str(free_port()), "--cores", "1"),
                        *("--memory", worker_memory, "--work-dir", str(work)),
                    ],
                    SPARK_LOCAL_DIRS=str(local),
                )
                self.worker_pids.append(proc.pid)
            self._wait(
                lambda st: sum(w.get("state") == "ALIVE" for w in st.get("workers", [])) >= workers,
                timeout,
                f"{workers} workers to register",
            )
        except BaseException:
            self.stop()
            raise

    # -- starting ------------------------------------------------------------------------

    def _start(self, name: str, cls: str, args: list[str], **env: str) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed in stop()
        self._logs.append(log)
        proc = subprocess.Popen(
            [os.path.join(self.home, "bin", "spark-class"), cls, *args],
            env={**self._env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own group: stop() kills it with what it started
        )
        self._procs.append(proc)
        return proc

    def state(self) -> dict[str, Any]:
        """The master's view (its web UI's /json/): workers, active applications, ..."""
        url = f"http://{LOOPBACK}:{self.ui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return dict(json.load(resp))

    def _wait(self, cond: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            dead = [p for p in self._procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"a Spark daemon exited ({dead[0].args[1]}):\n{self.logs()}")
            try:
                if cond(self.state()):
                    return
            except OSError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(0.25)

    def logs(self, tail: int = 2000) -> str:
        """The end of each daemon's log (for failure messages)."""
        out = []
        for f in sorted(self.workdir.glob("*.log")):
            out.append(f"--- {f.name}\n{f.read_text(errors='replace')[-tail:]}")
        return "\n".join(out)

    # -- what an application needs --------------------------------------------------------

    def session_conf(
        self,
        *,
        executor_env: Mapping[str, str] | None = None,
        executor_memory: str = "512m",
        driver_memory: str = "1g",
    ) -> dict[str, str]:
        """Spark settings of a driver on this machine using the cluster: every worker's core,
        driver bound to loopback, `executor_env` sent to the executors (spark.executorEnv.*)."""
        conf = {
            "spark.master": self.master_url,
            "spark.driver.host": LOOPBACK,
            "spark.driver.bindAddress": LOOPBACK,
            "spark.driver.memory": driver_memory,
            "spark.executor.memory": executor_memory,
            "spark.executor.cores": "1",
            "spark.cores.max": str(len(self.worker_pids)),
            "spark.pyspark.python": sys.executable,
        }
        for key, value in (executor_env or {}).items():
            conf[f"spark.executorEnv.{key}"] = value
        return conf

    # -- executors -----------------------------------------------------------------------------

    def active_apps(self) -> list[str]:
        return [str(a["id"]) for a in self.state().get("activeapps", [])]

    def executors(self, app_id: str | None = None) -> list[Executor]:
        """The living executor JVMs the workers launched (of `app_id` when given)."""
        table = _proc_table()
        out = []
        for i, wpid in enumerate(self.worker_pids):
            for pid in descendants(wpid, table):
                cmd = table[pid].cmd
                if EXECUTOR_CLASS not in cmd:
                    continue
                self._seen[pid] = table[pid].started
                for child in descendants(pid, table):
                    self._seen[child] = table[child].started
                app = _arg(cmd, "--app-id")
                if app_id is None or app == app_id:
                    out.append(
                        Executor(pid, i, app, _arg(cmd, "--executor-id"), table[pid].started)
                    )
        return out

    def wait_executors(self, n: int, timeout: float = 120.0) -> tuple[str, list[Executor]]:
        """Wait until one application is active with `n` executor JVMs; (app id, executors)."""
        deadline = time.monotonic() + timeout
        while True:
            apps = self.active_apps()
            if len(apps) == 1:
                found = self.executors(apps[0])
                if len(found) >= n:
                    return apps[0], found
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no application with {n} executors within {timeout:.0f} s "
                    f"(active: {apps}, executors: {self.executors()})"
                )
            time.sleep(0.2)

    def kill_executor(self, executor: Executor, timeout: float = 30.0) -> None:
        """SIGKILL one executor JVM and wait until it is gone (its Python workers see their
        JVM go and exit; the worker reports the loss and the master starts another)."""
        if alive(executor.pid, executor.started):
            table = _proc_table()  # its Python workers, for stop() to check on
            self._seen.update({p: table[p].started for p in descendants(executor.pid, table)})
            with contextlib.suppress(ProcessLookupError):
                os.kill(executor.pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while alive(executor.pid, executor.started):
            if time.monotonic() > deadline:
                raise TimeoutError(f"executor JVM {executor.pid} still alive after SIGKILL")
            time.sleep(0.1)

    def executor_killer(
        self, rng: Any, executors: int, kills: list[dict[str, Any]], idle_max: float = 1.0
    ) -> Any:
        """An `on_write` hook for `spark.random_kill.kill_rounds`: while the driver runs
        (before its own SIGKILL, `kill_in` seconds away), SIGKILL one of the application's
        `executors` executor JVMs at a random moment; each kill (or a driver that ended
        first) is appended to `kills`, with `killed_at` the driver's kill time."""

        def kill_an_executor(round_no: int, proc: Any, kill_in: float | None) -> None:
            app, execs = self.wait_executors(executors, timeout=120)
            top = 0.8 * kill_in if kill_in is not None else idle_max
            after = rng.uniform(0, top)
            victim = rng.choice(sorted(execs, key=lambda e: e.worker))
            driver_at = time.time() + kill_in if kill_in is not None else None
            time.sleep(after)
            running = proc.poll() is None
            if running:
                self.kill_executor(victim)
            kills.append(
                {"round": round_no, "after_s": round(after, 2), "worker": victim.worker,
                 "executor": victim.executor_id, "app": app, "driver_running": running,
                 "driver_killed_at": driver_at}
            )  # fmt: skip

        return kill_an_executor

    # -- stopping ------------------------------------------------------------------------------

    def processes(self) -> dict[int, int]:
        """Every living process of the cluster (pid -> start time): daemons, executors,
        their Python workers (also Python daemons in process groups of their own)."""
        table = _proc_table()
        pids = [p.pid for p in self._procs if p.pid in table]
        for p in list(pids):
            pids.extend(descendants(p, table))
        return {p: table[p].started for p in pids}

    def stop(self, timeout: float = 20.0) -> None:
        """Stop every daemon and what it started (SIGTERM, then SIGKILL), idempotent."""
        doomed = self.processes()
        for proc in self._procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(deadline - time.monotonic(), 0.1))
        doomed.update(self.processes())
        doomed.update(self._seen)  # e.g. Python workers of an executor killed earlier
        for proc in self._procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for pid, started in doomed.items():
            if alive(pid, started):  # the same process, not a new one under a reused pid
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for proc in self._procs:
            proc.wait()
        deadline = time.monotonic() + timeout
        while any(alive(p, t) for p, t in doomed.items()) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.left = {p: t for p, t in doomed.items() if alive(p, t)}
        for log in self._logs:
            log.close()
        self._logs.clear()

    def __enter__(self) -> SparkCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
