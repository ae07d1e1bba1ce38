"""The JMS acknowledge modes mapped onto AMQP: CLIENT, DUPS_OK, INDIVIDUAL, TRANSACTED.

Run: python -m examples.ack_modes
"""

from __future__ import annotations

from typing import Any

from ackkit import AckMode, App, Consumer, Delivery

from ._common import Broker, broker_for_cli, cleanup, publish_json, settled

QUEUE = "example.modes"


def _run(broker: Broker, mode: AckMode) -> dict[str, Any]:
    q = f"{QUEUE}.{mode.value}"
    cleanup(broker, q, f"{q}.dlq")
    publish_json(broker.url, q, [{"n": i} for i in range(20)])
    app = App(broker.url)

    if mode is AckMode.CLIENT:

        @app.listener(q, ack_mode=mode, consumer=Consumer(prefetch=10), name=f"{q}:h")
        def client(d: Delivery) -> None:
            if d.json()["n"] % 5 == 4:
                d.ack()  # acks this one and the four before it (multiple=True)

    elif mode is AckMode.INDIVIDUAL:

        @app.listener(q, ack_mode=mode, consumer=Consumer(prefetch=10), name=f"{q}:h")
        def individual(d: Delivery) -> None:
            d.ack()  # exactly this delivery, sent at once

    else:

        @app.listener(q, ack_mode=mode, consumer=Consumer(prefetch=10), name=f"{q}:h")
        def auto(body: dict[str, int]) -> None:
            pass

    with app.running():
        settled(broker, q)
        stats = app.stats()[f"{q}:h"]
    left = broker.counts(q)  # what the broker says, after the app has stopped
    cleanup(broker, q, f"{q}.dlq")
    return {
        "acked": stats["acked"],
        "ack_frames": stats["ack_frames"],
        "left": (left.ready, left.unacked),
    }


def main(broker: Broker) -> dict[str, Any]:
    out = {}
    for mode in (AckMode.CLIENT, AckMode.DUPS_OK, AckMode.INDIVIDUAL, AckMode.TRANSACTED):
        out[mode.value] = r = _run(broker, mode)
        print(f"    {mode.value:<11} 20 messages acked with {r['ack_frames']:>2} ack frames")
    return out


if __name__ == "__main__":
    with broker_for_cli() as b:
        main(b)
