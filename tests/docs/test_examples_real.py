"""The docs' blocks marked ``<!-- test: real-broker -->`` run on the test kit's real
RabbitMQ (``rabbitmq`` fixture): each in a namespace of its own, after its hidden
setup, with its ``test_*`` functions called with the kit's fixtures."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from ._blocks import ROOT, Block, blocks, pages

pytestmark = pytest.mark.integration

REAL = [b for p in pages() for b in blocks(p) if b.marker == "real-broker"]
# the README's test is written for either broker: it runs on the real one too
REAL += [
    b
    for b in blocks(ROOT / "README.md")
    if b.lang == "python" and b.marker is None and "(amqp_broker" in b.code
]
DOC_URL = "amqp://guest:guest@127.0.0.1:5672/%2f"


@pytest.mark.parametrize("block", REAL, ids=lambda b: b.where)
def test_real_broker_example_runs(
    block: Block, rabbitmq: Any, queue_factory: Any, tmp_path: Any
) -> None:
    fixtures = {
        "rabbitmq": rabbitmq,
        "amqp_broker": rabbitmq,
        "amqp_url": rabbitmq.url,
        "queue_factory": queue_factory,
        "tmp_path": tmp_path,
    }
    ns: dict[str, Any] = {"__name__": "docs_real_example", "url": rabbitmq.url}
    for code in [*block.setup, block.code]:
        exec(compile(code.replace(DOC_URL, rabbitmq.url), block.where, "exec"), ns)
    for name, fn in list(ns.items()):
        if name.startswith("test_") and callable(fn):
            args = []
            for p in inspect.signature(fn).parameters:
                args.append(queue_factory() if p == "fresh_queue" else fixtures[p])
            fn(*args)


def test_there_are_real_broker_examples() -> None:
    assert REAL, f"no block in {ROOT}/docs is marked real-broker"
