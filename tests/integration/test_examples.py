"""Every example runs against a real broker (so none of them rots), checked on the broker."""

from __future__ import annotations

import importlib

import pytest

pytestmark = pytest.mark.integration


def run(name: str, rabbitmq, **kw):
    return importlib.import_module(f"examples.{name}").main(rabbitmq, **kw)


def test_auto_ack(rabbitmq):
    out = run("auto_ack", rabbitmq)
    assert out["handled"] == [1, 2, 3, 4, 5]
    assert out["dead_lettered"] == 3  # the raising order, the non-JSON body, the bad schema
    assert any(r.startswith("bad payload") for r in out["reasons"])
    assert out["table"]["example.orders"] == (0, 0)  # the broker: nothing left, nothing unacked


def test_manual_ack(rabbitmq):
    out = run("manual_ack", rabbitmq)
    assert out["table"] == {"example.manual": (0, 0), "example.manual.dlq": (4, 0)}


def test_ack_modes(rabbitmq):
    out = run("ack_modes", rabbitmq)
    assert all(r["acked"] == 20 for r in out.values())
    assert all(r["left"] == (0, 0) for r in out.values())  # asked of the broker
    assert out["individual"]["ack_frames"] == 20
    assert out["client"]["ack_frames"] < 20


def test_batch_ack(rabbitmq):
    out = run("batch_ack", rabbitmq)
    done = sorted(n for b in out["batches"] for n in b)
    assert set(done) == set(range(10))
    assert any(b[0] == 7 for b in out["batches"][1:])  # the unacknowledged tail came back
    assert out["table"] == {"example.batch": (0, 0), "example.batch.dlq": (0, 0)}


def test_pull_mode(rabbitmq):
    out = run("pull_mode", rabbitmq)
    assert out["table"] == {"example.pull": (0, 0)}
    assert out["log"][-1].startswith("queue empty")


def test_async_app(rabbitmq):
    pytest.importorskip("aio_pika")
    out = run("async_app", rabbitmq)
    assert len(out["handled"]) == 27
    assert sorted(x.split(":")[0] for x in out["dead_lettered"]) == [
        "17",
        "27",
        "7",
    ]  # from the DLQ
    # The table is read after the DLQ was drained by the example's pull connection.
    assert out["table"] == {"example.async.orders": (0, 0), "example.async.orders.dlq": (0, 0)}


def test_throughput_example_drains_the_queue(rabbitmq):
    out = run("throughput", rabbitmq, n=2000)
    assert out["left"] == (0, 0)
    assert out["rates"]["ackkit.sync.auto"] > 0


def test_testing_in_memory_runs_without_a_broker():
    mod = importlib.import_module("examples.testing_in_memory")
    out = mod.main()  # its own InMemoryBroker: no network
    check_testing_example(out)


def test_testing_in_memory_runs_on_a_real_broker_too(rabbitmq):
    check_testing_example(run("testing_in_memory", rabbitmq))


def check_testing_example(out):
    assert out["handled"] == [1, 3]
    assert out["tries"][3] == 2  # retried once through the delay queue
    assert out["dead"] == ["order 2: quantity must be at least 1"]
    assert out["async_handled"] == [{"id": 4, "qty": 1}]
    assert out["left"] == {
        "example.memory.orders": (0, 0),
        "example.memory.orders.dlq": (0, 0),
    }


def test_publishing(rabbitmq):
    out = run("publishing", rabbitmq)
    assert out["replies"] == [(f"req-{i}", {"accepted": i}) for i in (1, 2, 3)]
    assert "order.cancelled" in out["unroutable"]
    assert out["table"] == {
        "example.pub.orders": (0, 0),
        "example.pub.invoices": (0, 0),
        "example.pub.replies": (0, 0),
    }


def test_exchanges(rabbitmq):
    out = run("exchanges", rabbitmq)
    assert out["seen"] == [
        ("audit", "anything"),
        ("billing", "order.created"),
        ("billing", "order.paid"),
        ("billing", "refund.partial.eu"),
        ("shipping", "order.paid"),
    ]
    assert "example.audit.log.dlq" in out["channels"]
    assert all(v == (0, 0) for v in out["table"].values())


def test_stream_publishing(stream_broker):
    pytest.importorskip("rstream")
    out = importlib.import_module("examples.stream_publishing").main(
        stream_broker.url, stream_broker.stream_port
    )
    assert (out["before"], out["after"], out["confirmed"]) == (100, 150, 150)
    assert out["stored"] == 150  # counted by reading the stream: nothing twice
