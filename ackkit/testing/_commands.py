"""Running rabbitmqctl and erl_call: bounded by a timeout, optionally as the
node's user, and failing with a :class:`BrokerError` whose text hides passwords."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Any

from ._errors import BrokerError
from ._util import mask_secrets


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
