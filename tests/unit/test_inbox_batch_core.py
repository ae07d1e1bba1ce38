"""A batch listener's inbox decisions (`_core.inbox.plan_batch`, `batch_run`,
`end_batch`) against a model: any batch of keys, some recorded already, any AckIndex
or a raising handler."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ackkit._core.inbox import MAX_KEY_LENGTH, MissingKey, batch_run, end_batch, plan_batch
from ackkit._core.outcome import AckIndex, succeeded

# a small alphabet: twins in a batch and keys recorded already are common
batch_keys = st.lists(st.one_of(st.none(), st.sampled_from("abcdef")), max_size=12)


@given(
    keys=batch_keys,
    db=st.sets(st.sampled_from("abcdef")),
    missing=st.sampled_from(list(MissingKey)),
    index=st.one_of(st.none(), st.integers(-3, 14)),
    raised=st.booleans(),
)
def test_a_batch_transaction_against_the_model(
    keys: list[str | None], db: set[str], missing: MissingKey, index: int | None, raised: bool
) -> None:
    plan = plan_batch(keys, missing)
    # the transaction claims in key order, each key once
    claimed_keys = [k for _, k in plan.claims]
    assert claimed_keys == sorted(set(k for k in keys if k is not None))
    recorded = [i for i, k in plan.claims if k in db]
    run = batch_run(plan, recorded)
    result = None if index is None else AckIndex(index)
    done = None if raised else succeeded(result, len(run), True)
    end = end_batch(plan, recorded, run, done)

    # the handler gets, in batch order: the first delivery of each key not recorded, and
    # keyless ones with MissingKey.RUN; never a recorded key, a twin, a dead-lettered one
    first = {k: keys.index(k) for k in set(keys) if k is not None}
    want_run = [
        i
        for i, k in enumerate(keys)
        if (k is None and missing is MissingKey.RUN)
        or (k is not None and first[k] == i and k not in db)
    ]
    assert list(run) == want_run
    dead = [i for i, _ in plan.dead]
    assert dead == (
        [i for i, k in enumerate(keys) if k is None] if missing is MissingKey.DEAD_LETTER else []
    )

    # every delivery has exactly one fate
    fates = sorted([*dead, *end.duplicates, *end.settled])
    assert fates == list(range(len(keys)))

    # what the commit records: the keys of the handler's succeeded prefix (none if it raised)
    ok = [] if done is None else list(run[:done])
    committed = {keys[i] for i in ok if keys[i] is not None}
    claimed_new = {keys[i] for i in run if keys[i] is not None}
    left = claimed_new - set(end.unrecord)
    assert (left if done is not None else set()) == committed
    assert set(end.unrecord).isdisjoint(committed)
    final = db | committed

    # the listener's rules settle the handler's list first (its first `done` succeed),
    # then the twins of deliveries that failed
    assert list(end.settled[: len(run)]) == list(run)
    for i in end.settled[len(run) :]:
        k = keys[i]
        assert k is not None and first[k] != i and k not in final
    # a delivery is a duplicate iff its key was recorded (before, or by this commit's
    # earlier twin), and it never ran
    for i in end.duplicates:
        assert keys[i] in final and i not in run
    for i, k in enumerate(keys):
        if k is not None and i not in run and k in final:
            assert i in end.duplicates


def test_ack_index_records_only_the_prefix() -> None:
    plan = plan_batch(["a", "b", "a", "c", "d"], MissingKey.DEAD_LETTER)
    run = batch_run(plan, [])
    assert run == (0, 1, 3, 4)  # the second "a" is a twin
    end = end_batch(plan, [], run, succeeded(AckIndex(1), len(run), True))
    assert end.unrecord == ("c", "d")  # removed before the commit: not done
    assert end.duplicates == (2,)  # twin of a recorded "a"
    assert end.settled == (0, 1, 3, 4)


def test_a_twin_of_a_failed_delivery_fails_with_it() -> None:
    plan = plan_batch(["a", "b", "b"], MissingKey.DEAD_LETTER)
    run = batch_run(plan, [])
    end = end_batch(plan, [], run, succeeded(AckIndex(0), len(run), True))
    assert end.unrecord == ("b",) and end.duplicates == () and end.settled == (0, 1, 2)


def test_a_raising_handler_records_nothing_but_duplicates_stay_duplicates() -> None:
    plan = plan_batch(["a", "b", "a", None], MissingKey.DEAD_LETTER)
    recorded = [i for i, k in plan.claims if k == "a"]
    run = batch_run(plan, recorded)
    assert run == (1,)
    end = end_batch(plan, recorded, run, None)
    assert end.unrecord == () and end.duplicates == (0, 2) and end.settled == (1,)
    assert plan.dead == ((3, plan.dead[0][1]),) and "no inbox key" in plan.dead[0][1]


def test_a_refused_or_too_long_key_is_dead_lettered() -> None:
    plan = plan_batch(["a", "x" * (MAX_KEY_LENGTH + 1), "b"], MissingKey.RUN, {2: "boom"})
    assert [i for i, _ in plan.dead] == [1, 2]
    assert batch_run(plan, []) == (0,)
