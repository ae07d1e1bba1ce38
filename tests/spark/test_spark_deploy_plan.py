"""Deployment changes between restarts, the pure parts (no Spark, no broker): which
order the per-queue sources are unioned in, offsets that name another queue, who owns a
write-ahead log, what a closed consumer channel becomes."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("pyspark")

from ackkit.spark._checkpoint import batch_offsets, query_id, recorded_queues
from ackkit.spark._deploy import (
    ChannelVerdict,
    DeploymentChanged,
    Owner,
    ShardQueue,
    WalVerdict,
    batch_to_offer,
    channel_verdict,
    check_extra_shards,
    check_offset,
    shard_order,
    source_name,
    source_order,
    wal_owner,
)
from ackkit.spark._wal import WriteAheadLog

pytestmark = [pytest.mark.spark, pytest.mark.one_leg]

NAMES = st.lists(st.text("abcxyz.-_", min_size=1, max_size=6), min_size=1, max_size=6, unique=True)


def spark_hands_out(recorded: list[str], order: list[str]) -> dict[str, str]:
    """What Spark does on a restart: the i-th source gets the i-th recorded offset."""
    assert len(recorded) == len(order)
    return dict(zip(order, recorded, strict=True))


@given(NAMES, st.randoms(use_true_random=False))
def test_any_reordering_hands_every_source_its_own_queues_offset(names, rnd):
    first = source_order(names, None)
    assert sorted(first) == sorted(names)
    again = list(names)
    rnd.shuffle(again)
    order = source_order(again, first)
    got = spark_hands_out(first, order)
    assert all(got[q] == q for q in order)
    # and the offset each source gets is accepted as its own
    for q in order:
        assert check_offset(q, {"ackkit": got[q], "seq": 7}) == 7


@given(NAMES, st.randoms(use_true_random=False))
def test_a_checkpoint_in_any_old_order_is_followed(names, rnd):
    """Checkpoints written before the order was fixed recorded the user's order."""
    legacy = list(names)
    rnd.shuffle(legacy)
    again = list(names)
    rnd.shuffle(again)
    assert source_order(again, legacy) == legacy


@given(NAMES, NAMES)
def test_adding_or_removing_queues_is_refused_naming_them(old, new):
    if set(old) == set(new):
        assert source_order(new, old) == old
        return
    with pytest.raises(DeploymentChanged) as e:
        source_order(new, old, checkpoint="CK")
    msg = str(e.value)
    assert "CK" in msg
    for q in set(new) - set(old):
        assert repr(q) in msg.split("adds", 1)[1]
    for q in set(old) - set(new):
        assert repr(q) in msg.split("removes", 1)[1]
    assert "new checkpoint" in msg or "own checkpoint" in msg


def test_a_source_without_an_offset_yet_keeps_its_place():
    assert source_order(["b", "a", "c"], ["c", None, "a"]) == ["c", "b", "a"]


@given(NAMES, st.text("abc", min_size=1, max_size=3), st.integers(0, 10**12))
def test_an_offset_of_another_queue_is_refused(names, other, seq):
    q = names[0]
    assert check_offset(q, {"ackkit": q, "seq": seq}) == seq
    if other != q:
        with pytest.raises(DeploymentChanged, match="order"):
            check_offset(q, {"ackkit": other, "seq": seq})


def test_a_shard_count_change_is_refused_before_declaring():
    two = ["ex.shard-0", "ex.shard-1"]
    four = [f"ex.shard-{i}" for i in range(4)]
    assert shard_order("ex", two, two) == two
    assert shard_order("ex", two, None) == two
    with pytest.raises(DeploymentChanged, match=r"shards=2.*shards=4.*Nothing was declared"):
        shard_order("ex", four, two, checkpoint="CK")
    with pytest.raises(DeploymentChanged, match=r"shards=4.*shards=2"):
        shard_order("ex", two, four)


def test_shard_queues_beyond_the_count_are_refused_naming_them_and_their_messages():
    check_extra_shards("ex", 2, [])  # nothing left over: go on
    left = [ShardQueue("ex.shard-2", 310, 0), ShardQueue("ex.shard-3", 1, 1)]
    with pytest.raises(DeploymentChanged) as e:
        check_extra_shards("ex", 2, left)
    msg = str(e.value)
    assert "'ex.shard-2' (310 messages)" in msg and "'ex.shard-3' (1 message, 1 consumer)" in msg
    assert "shards=4 or more" in msg and "Nothing was declared" in msg and "delete" in msg
    # even empty: the exchange still routes new messages to them
    with pytest.raises(DeploymentChanged, match=r"'ex.shard-1' \(0 messages\)"):
        check_extra_shards("ex", 1, [ShardQueue("ex.shard-1", 0, 0)])


def test_recorded_queues_reads_the_newest_offsets_by_position(tmp_path: Path):
    assert recorded_queues(tmp_path) is None
    off = tmp_path / "offsets"
    off.mkdir()
    meta = '{"batchWatermarkMs":0}'
    (off / "0").write_text(f'v1\n{meta}\n{{"ackkit":"a","seq":0}}\n{{"ackkit":"b","seq":0}}\n')
    (off / "3").write_text(f'v1\n{meta}\n{{"ackkit":"b","seq":9}}\n-\n{{"x":1}}\n')
    rec = recorded_queues(tmp_path)
    assert rec is not None and rec.queues == ["b", None] and not rec.by_name
    assert batch_offsets(tmp_path, 3) == [("b", 9)]


def test_named_sources_offsets_are_read_by_name(tmp_path: Path):
    """Spark 4.2+ source evolution writes `name:offset` lines (version v2)."""
    off = tmp_path / "offsets"
    off.mkdir()
    (off / "1").write_text(
        'v2\n{"batchWatermarkMs":0}\nrabbitmq_a_1:{"ackkit": "a", "seq": 2}\n'
        'rabbitmq_b_2:{"ackkit": "b", "seq": 5}\n'
    )
    rec = recorded_queues(tmp_path)
    assert rec is not None and rec.queues == ["a", "b"] and rec.by_name
    assert batch_offsets(tmp_path, 1) == [("a", 2), ("b", 5)]


@given(NAMES, NAMES)
def test_named_sources_may_be_added_removed_and_reordered(old, new):
    assert sorted(source_order(new, old, by_name=True)) == sorted(new)


@given(st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=8, unique=True))
def test_source_names_are_spark_names_and_distinct(queues):
    names = [source_name(q) for q in queues]
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"[A-Za-z0-9_]+", n) for n in names)


# -- write-ahead log ownership ---------------------------------------------------------

ME = Owner("q-1", "/ck/one")
OTHER = Owner("q-2", "/ck/two")


def test_a_logged_batch_is_offered_again_and_a_log_ahead_of_the_offsets_is_refused():
    logged = [(0, 10), (10, 25), (25, 30)]
    assert batch_to_offer("q", 10, logged) == (10, 25)  # handed out before: the same rows
    assert batch_to_offer("q", 30, logged) is None  # a new batch
    assert batch_to_offer("q", 0, []) is None
    with pytest.raises(DeploymentChanged) as e:
        batch_to_offer("q", 12, logged, wal="/w/q-1", checkpoint="/ck/one")
    msg = str(e.value)
    assert "'q'" in msg and "/w/q-1" in msg and "/ck/one" in msg and "(10, 25] and 1 later" in msg
    assert "new checkpoint with a wal_location of its own" in msg


def test_a_log_is_claimed_once_then_refused_to_another_checkpoint():
    assert wal_owner("W", ME, None, has_batches=False, checkpoint_has_offsets=False) is (
        WalVerdict.CLAIM
    )
    assert wal_owner("W", ME, ME, has_batches=True, checkpoint_has_offsets=True) is (
        WalVerdict.MINE
    )
    with pytest.raises(DeploymentChanged) as e:
        wal_owner("W", OTHER, ME, has_batches=True, checkpoint_has_offsets=False)
    msg = str(e.value)
    assert "/ck/one" in msg and "/ck/two" in msg and "W" in msg and "wal_location" in msg
    # a checkpoint without Spark's metadata yet (read_stream, before the query starts)
    with pytest.raises(DeploymentChanged, match=r"checkpoint /ck/two \(new\)"):
        wal_owner("W", Owner("", "/ck/two"), ME, has_batches=False, checkpoint_has_offsets=False)


def test_an_unowned_log_with_batches_is_claimed_only_by_the_checkpoint_that_read_it():
    assert wal_owner("W", ME, None, has_batches=True, checkpoint_has_offsets=True) is (
        WalVerdict.CLAIM
    )
    with pytest.raises(DeploymentChanged, match="wal_location"):
        wal_owner("W", ME, None, has_batches=True, checkpoint_has_offsets=False)


@given(st.text(max_size=20), st.text(max_size=20))
def test_owner_round_trips(qid, ck):
    o = Owner(qid, ck)
    assert Owner.from_json(o.to_json()) == o


# -- the consumer's channel closed by the broker ---------------------------------------


def test_a_deleted_queue_fails_the_query():
    v = channel_verdict(
        "q", 404, "NOT_FOUND - no queue 'q'", exclusive=True, refused_for=0, patience=60
    )
    assert not v.retry and v.fail and "deleted" in v.fail and "'q'" in v.fail


def test_another_exclusive_consumer_is_waited_for_saying_so_once_then_fails():
    v0 = channel_verdict("q", 403, "in exclusive use", exclusive=True, refused_for=0, patience=5)
    assert v0.retry and v0.log and "waiting" in v0.log and v0.fail is None
    v1 = channel_verdict("q", 403, "in exclusive use", exclusive=True, refused_for=2, patience=5)
    assert v1 == ChannelVerdict()
    v2 = channel_verdict("q", 403, "in exclusive use", exclusive=True, refused_for=5, patience=5)
    assert not v2.retry and v2.fail and "another query" in v2.fail


@given(st.integers(0, 600).filter(lambda c: c not in (403, 404)), st.booleans())
def test_other_closes_are_retried(code, exclusive):
    v = channel_verdict("q", code, "x", exclusive=exclusive, refused_for=100, patience=1)
    assert v.retry and v.fail is None


def test_a_log_on_disk_records_its_checkpoint_and_refuses_another(tmp_path: Path):
    wal = WriteAheadLog(tmp_path / "wal")
    wal.create()
    wal.claim(ME, checkpoint_has_offsets=False)
    assert wal.owner() == ME
    wal.write(0, 2, pa.record_batch({"x": [1, 2]}))
    wal.claim(ME, checkpoint_has_offsets=True)  # a restart of the same query
    with pytest.raises(DeploymentChanged) as e:
        WriteAheadLog(tmp_path / "wal").claim(OTHER, checkpoint_has_offsets=False)
    assert "/ck/one" in str(e.value) and "/ck/two" in str(e.value)
    assert wal.owner() == ME  # the refused query changed nothing
    assert wal.batches() == [(0, 2)]


def test_query_id_is_sparks_checkpoint_metadata(tmp_path: Path):
    assert query_id(tmp_path) is None
    (tmp_path / "metadata").write_text('{"id":"2f6c0d1e-aaaa"}')
    assert query_id(tmp_path) == "2f6c0d1e-aaaa"
