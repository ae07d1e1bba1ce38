"""make test's broker legs share out the runs parametrized by runtime, and the runs of the
tests marked `one_leg` (tests/conftest.py): together they still run every one, each once,
each leg keeps both runtimes, and the in-memory broker's runs stay whole."""

from __future__ import annotations

import os
import subprocess
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = [
    "tests/integration/test_refused_copies.py",  # parametrized by runtime
    "tests/integration/test_crash_loops.py",  # shares out its queue type instead
    "tests/integration/test_stop_returns_once.py",  # App / AsyncApp, with another parameter
    "tests/adversarial/test_alarms.py",  # runtimes paired with alarms: the runs shared out
    "tests/contract/test_ordering.py",  # the contract suite: its in-memory runs kept whole
    "tests/integration/test_dlq_replay.py",  # one_leg: each test on one leg
]


def collect(*, fresh: bool = False, **env: str) -> set[str]:
    """The test ids pytest collects with `env`: from this run's cache, or `fresh`."""
    key = tuple(sorted(env.items()))
    return set(_collect.__wrapped__(key) if fresh else _collect(key))


@cache  # each collection a pytest process of its own (3-4 s): the whole set once a run
def _collect(env_items: tuple[tuple[str, str], ...]) -> frozenset[str]:
    env = dict(env_items)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *MODULES,
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=ROOT,
        env={**os.environ, "ACKKIT_TEST_RABBITMQ": "3.10", **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return frozenset(line.strip() for line in out.splitlines() if "::" in line)


def test_the_two_legs_together_run_every_run_once_and_each_leg_both_runtimes() -> None:
    every = collect()
    shared = {"ACKKIT_TEST_PAIRED": "tests/", "ACKKIT_TEST_UNPAIRED": ""}
    first = collect(ACKKIT_TEST_RUNTIMES="pick:0", **shared)
    second = collect(ACKKIT_TEST_RUNTIMES="pick:1", **shared)
    assert first | second == every
    # not parametrized (but one_leg), and the in-memory broker's runs: on both legs
    one_leg = {i for i in every if "test_dlq_replay" in i}
    memory = {i for i in every if "tests/contract/" in i and "-memory" in i}
    whole = {i for i in every if "[" not in i and i not in one_leg} | memory
    assert whole and first & second == whole  # the rest runs on exactly one leg
    assert one_leg & first and one_leg & second and not one_leg & first & second
    for leg in (first, second):
        runs = leg - whole
        assert any("[sync" in i for i in runs) and any("[async" in i for i in runs)
        ordering = [i for i in runs if "test_ordering" in i]
        assert ordering and all("-rabbitmq" in i for i in ordering)
        loops = [i for i in runs if "kills_its_consumer" in i]
        assert len(loops) == 3 and {"prompt", "slow", "async"} == {
            i.rsplit("-", 1)[1].rstrip("]") for i in loops
        }  # every writer, each with one queue type
        alarms = [i.split("::")[1].split("[")[0] for i in runs if "test_alarms" in i]
        assert len(alarms) == len(set(alarms)) == 3  # one run of each alarm test
    # stable from run to run (a leg that changed its mind would drop some runs)
    assert collect(fresh=True, ACKKIT_TEST_RUNTIMES="pick:0", **shared) == first


def test_a_module_one_leg_runs_alone_is_not_shared_out() -> None:
    every = collect()
    alone = collect(
        ACKKIT_TEST_RUNTIMES="pick:0",
        ACKKIT_TEST_PAIRED="tests/",
        ACKKIT_TEST_UNPAIRED="tests/integration/test_refused_copies.py",
    )
    refused = {i for i in every if "test_refused_copies" in i}
    assert refused <= alone
