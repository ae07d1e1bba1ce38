"""Rewrite docs/reference/cli.md from the `ackkit` command itself (every command's
--help at 80 columns): `python -m tests.docs.refresh_cli`. The docs tests compare the
page with the real output, and fail when a command is missing from it."""

from __future__ import annotations

from typing import Any

from ._blocks import DOCS

PAGE = DOCS / "reference" / "cli.md"

INTRO = """# CLI reference

The `ackkit` command comes with the `cli` extra (`pip install 'ackkit[cli]'`). Every
command that talks to a broker takes `--url`, or the `AMQP_URL` environment variable;
passwords are masked in everything it prints. For a cluster, give `--url` once per node
or one URL in the comma form ([the forms and the order nodes are tried
in](configuration.md#the-tools-take-the-same-addresses)). What each command does is described
where the task is: [`ackkit run`](../guide/running.md),
[`ackkit dlq`](../guide/failures.md#inspecting-and-replaying) and `ackkit queues`
(same section), [`ackkit docs`](asyncapi.md).

The help texts below are what `ackkit` prints (at 80 columns); the docs tests
run each command and compare (`python -m tests.docs.refresh_cli` rewrites this page).
"""


def commands() -> list[list[str]]:
    """Every command path, e.g. ["dlq", "inspect"], in the order --help lists them."""
    import typer.main

    from ackkit.cli import build_cli

    out: list[list[str]] = []

    def walk(cmd: Any, path: list[str]) -> None:
        subs = getattr(cmd, "commands", None)
        if subs is None:
            out.append(path)
            return
        for name in cmd.list_commands(None):
            walk(subs[name], [*path, name])

    walk(typer.main.get_command(build_cli()), [])
    return out


def help_text(argv: list[str]) -> str:
    from typer.testing import CliRunner

    from ackkit.cli import build_cli

    res = CliRunner().invoke(build_cli(), argv, env={"COLUMNS": "80"}, prog_name="ackkit")
    assert res.exit_code == 0, res.output
    return "\n".join(line.rstrip() for line in res.output.rstrip("\n").split("\n"))


def page() -> str:
    parts = [INTRO]
    for path in [[], *commands()]:
        argv = [*path, "--help"]
        title = " ".join(["ackkit", *path])
        parts.append(
            f"## `{title}`\n\n```console\n$ ackkit {' '.join(argv)}\n{help_text(argv)}\n```\n"
        )
    return "\n".join(parts)


if __name__ == "__main__":
    PAGE.write_text(page())
    print(f"wrote {PAGE}")
