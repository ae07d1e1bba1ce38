"""The chaos figures from synthetic records (no broker)."""

from __future__ import annotations

from .analysis import Fault, Story, analyse, parse_records


def stories(lines: str) -> dict[str, Story]:
    out: dict[str, Story] = {}
    assert parse_records(lines.strip().splitlines(), out) == 0
    return out


def test_clean_run() -> None:
    s = stories(
        """
        S 1.0 c-000001-good 1 0 7
        E 1.0 c-000001-good 1 ok 7
        S 1.0 c-000002-poison 1 0 7
        E 1.0 c-000002-poison 1 fail 7
        S 2.0 c-000002-poison 2 0 7
        E 2.0 c-000002-poison 2 fail 7
        S 3.0 c-000002-poison 3 0 7
        E 3.0 c-000002-poison 3 fail 7
        """
    )
    s["c-000002-poison"].dead.append(("attempts exhausted (3 of 3)", 3.1))
    s["c-000003-empty"] = Story(dead=[("bad payload: empty body", 1.2)])
    f = analyse(["c-000001-good", "c-000002-poison", "c-000003-empty"], s, [], 3)
    assert f["handled_ok"] == 1 and f.get("lost", 0) == 0
    assert f.get("dead_letter_mismatch", 0) == 0 and f.get("over_attempts", 0) == 0
    assert f.get("duplicates", 0) == 0 and f["dead_lettered"] == 2


def test_lost_missing_and_wrong_dead_letters() -> None:
    s = {"c-000009-poison": Story(dead=[("bad payload: x", 1.0)])}
    f = analyse(["c-000001-good", "c-000002-poison", "c-000009-poison"], s, [], 3)
    assert f["lost"] == 1 and f["dead_letter_mismatch"] == 2


def test_rerun_is_an_over_attempt_unless_a_fault_explains_it() -> None:
    lines = "\n".join(f"S {t}.0 c-000001-poison {a} 0 7" for t, a in enumerate([1, 2, 2, 3], 1))
    s = stories(lines)
    s["c-000001-poison"].dead.append(("attempts exhausted (3 of 3)", 5.0))
    f = analyse(["c-000001-poison"], s, [], 3)
    assert f["over_attempts"] == 1 and f["unexplained_reruns"] == 1
    f = analyse(["c-000001-poison"], s, [Fault(2.5, 2.6, "cut")], 3)
    assert f.get("over_attempts", 0) == 0 and f["duplicates"] == 1


def test_a_slow_message_is_not_excused_by_its_own_timeouts() -> None:
    lines = "\n".join(f"S {t}.0 c-000001-slow {a} 1 7" for t, a in enumerate([1, 2, 2, 2], 1))
    s = stories(lines)
    s["c-000001-slow"].dead.append(("attempts exhausted (2 of 3, last one lost)", 9.0))
    faults = [Fault(1.5, 2.5, "timeout"), Fault(2.5, 3.5, "timeout")]
    assert analyse(["c-000001-slow"], s, faults, 3)["over_attempts"] == 1


def test_bad_payload_redelivered_past_max_attempts_keeps_its_attempts_reason() -> None:
    s = {"c-000001-empty": Story(dead=[("attempts exhausted (3 of 3, last one lost)", 1.0)])}
    f = analyse(["c-000001-empty"], s, [], 3)
    assert f.get("dead_letter_mismatch", 0) == 0 and f["dead_lettered_after_losses"] == 1


def test_dead_letter_twins_need_a_fault_in_between() -> None:
    twins = [("bad payload: empty body", 1.0), ("bad payload: empty body", 3.0)]
    s = {"c-000001-empty": Story(dead=list(twins))}
    assert analyse(["c-000001-empty"], s, [], 3)["dead_letter_mismatch"] == 1
    f = analyse(["c-000001-empty"], s, [Fault(2.0, 2.1, "kill")], 3)
    assert f.get("dead_letter_mismatch", 0) == 0 and f["dlq_duplicates"] == 1
    far = [Fault(20.0, 20.1, "kill")]  # long after: no excuse
    assert analyse(["c-000001-empty"], s, far, 3)["dead_letter_mismatch"] == 1
