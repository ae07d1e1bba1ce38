"""Running rabbitmqctl and erl_call: bounded by a timeout, optionally as the
node's user, and failing with a :class:`BrokerError` whose text hides passwords.

Each run is counted (`SPENT`: per command and per test, the runs, their seconds and
the CPU their processes used): a rabbitmqctl run boots an Erlang VM of its own, about
a second of CPU, and the test kit's pytest plugin prints the tally at the end of a
session, so a suite that grows slow shows where (`spent_lines`).
"""

from __future__ import annotations

import os
import resource
import subprocess
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from ._errors import BrokerError
from ._util import mask_secrets

# (what, first argument, the test running) -> [runs, seconds, CPU seconds]
SPENT: defaultdict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])


def _verb(cmd: Sequence[str]) -> str:
    """The command of a rabbitmqctl argv (``... rabbitmqctl -n NODE list_queues ...``)."""
    args = list(cmd)
    at = next((i for i, a in enumerate(args) if a.endswith("rabbitmqctl")), 0)
    rest = iter(args[at + 1 :])
    for a in rest:
        if a in ("-n", "--node", "-t", "--timeout"):
            next(rest, None)
        elif not a.startswith("-"):
            return a
    return ""


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def count(what: str, verb: str, seconds: float, cpu: float) -> None:
    """Add one run of `what` (`verb`: its first argument) to the tally of the test that
    runs now (pytest's PYTEST_CURRENT_TEST, without its phase)."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
    row = SPENT[(what, verb, test)]
    row[0] += 1
    row[1] += seconds
    row[2] += cpu


def spent_lines(top: int = 8) -> list[str]:
    """The tally for people: the total per command, then the `top` tests by CPU."""
    if not SPENT:
        return []
    per_what: defaultdict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    per_test: defaultdict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for (what, verb, test), (n, secs, cpu) in SPENT.items():
        for row in (per_what[what if what != "rabbitmqctl" else f"{what} {verb}"], per_test[test]):
            row[0] += n
            row[1] += secs
            row[2] += cpu
    lines = [
        f"{what}: {int(n)} runs, {secs:.0f} s, {cpu:.0f} s CPU"
        for what, (n, secs, cpu) in sorted(per_what.items(), key=lambda kv: -kv[1][2])
    ]
    lines.append(f"the {top} tests whose commands used the most CPU:")
    for test, (n, secs, cpu) in sorted(per_test.items(), key=lambda kv: -kv[1][2])[:top]:
        who = test or "(outside a test)"
        lines.append(f"  {cpu:5.0f} s CPU, {secs:5.0f} s, {int(n):3d} runs  {who}")
    return lines


def _run(
    cmd: Sequence[str],
    *,
    what: str,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    user: tuple[int, int] | None = None,
    input_text: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `cmd` with a timeout (as `user` if given); `what` names it in the BrokerError
    that a failure to start or a timeout raises."""
    kwargs: dict[str, Any] = {}
    if user is not None:
        kwargs.update(user=user[0], group=user[1], extra_groups=[])
    started, cpu0 = time.monotonic(), _children_cpu()
    verb = _verb(cmd) if what == "rabbitmqctl" else ""
    try:
        return subprocess.run(
            list(cmd),
            input=input_text,
            capture_output=True,
            text=True,
            env=env,
            cwd=cwd,
            timeout=timeout,
            check=False,
            **kwargs,
        )
    except subprocess.TimeoutExpired as exc:
        raise BrokerError(
            f"{what} timed out after {timeout:.0f}s: {mask_secrets(' '.join(cmd))}"
        ) from exc
    except OSError as exc:
        raise BrokerError(f"{what} could not be run ({exc}): {cmd[0]}") from exc
    finally:  # the CPU of reaped children: other threads' children too, now and then
        count(what, verb, time.monotonic() - started, _children_cpu() - cpu0)


def _check(res: subprocess.CompletedProcess[str], what: str, args: Sequence[str]) -> str:
    """The output of `res`, or a BrokerError naming `what`, its arguments and its output
    when it exited non-zero."""
    if res.returncode != 0:
        output = (res.stdout + "\n" + res.stderr).strip()
        raise BrokerError(
            f"{what} {' '.join(args)} failed with exit code {res.returncode}:\n"
            + mask_secrets(output[-4000:])
        )
    return res.stdout
