"""The test kit's reading of a node's answers about a queue's declaration (erl_call's
and rabbitmqctl's), without a node."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ackkit.testing import DeclaredQueue
from ackkit.testing._queries import _read_declared, _read_declared_json


def _hex(text: str) -> str:
    return text.encode("utf-8").hex()


def test_every_tag_reads_as_its_python_value() -> None:
    answer = "rabbit_quorum_queue;" + "".join(
        f"{_hex(k)},{v};"
        for k, v in [
            ("x-dead-letter-exchange", "s" + _hex("dlx ü")),
            ("x-delivery-limit", "i-5"),
            ("x-single-active-consumer", "btrue"),
            ("x-ratio", "f2.50000000000000000000e+00"),
            ("x-table", "t" + _hex('[{<<"a">>,long,1}]')),
        ]
    )
    assert _read_declared(answer) == DeclaredQueue(
        "quorum",
        {
            "x-dead-letter-exchange": "dlx ü",
            "x-delivery-limit": -5,
            "x-single-active-consumer": True,
            "x-ratio": 2.5,
            "x-table": '[{<<"a">>,long,1}]',
        },
    )


def test_missing_is_none_and_a_queue_without_arguments_has_none() -> None:
    assert _read_declared("missing") is None
    assert _read_declared("rabbit_classic_queue;") == DeclaredQueue("classic", {})


@pytest.mark.parametrize("bad", ["rabbit_classic_queue;6162,q1;", "rabbit_classic_queue;zz,i1;"])
def test_an_answer_not_understood_raises_value_error(bad: str) -> None:
    with pytest.raises(ValueError):
        _read_declared(bad)


@given(
    st.dictionaries(
        st.text(min_size=1),
        st.one_of(st.text(), st.integers(), st.booleans()),
        max_size=5,
    )
)
def test_any_arguments_read_back_as_sent(arguments: dict[str, object]) -> None:
    def tagged(v: object) -> str:
        if isinstance(v, bool):
            return "b" + str(v).lower()
        if isinstance(v, int):
            return f"i{v}"
        return "s" + _hex(str(v))

    items = "".join(f"{_hex(k)},{tagged(v)};" for k, v in arguments.items())
    answer = "rabbit_stream_queue;" + items
    assert _read_declared(answer) == DeclaredQueue("stream", arguments)


def test_rabbitmqctl_rows_read_in_both_forms() -> None:
    rows_3x = [{"name": "q", "type": "classic", "arguments": [["x-message-ttl", "long", 400]]}]
    rows_4x = [{"name": "q", "type": "quorum", "arguments": {"x-queue-type": "quorum"}}]
    assert _read_declared_json(json.dumps(rows_3x), "q") == DeclaredQueue(
        "classic", {"x-message-ttl": 400}
    )
    assert _read_declared_json(json.dumps(rows_4x), "q") == DeclaredQueue(
        "quorum", {"x-queue-type": "quorum"}
    )
    assert _read_declared_json(json.dumps(rows_4x), "other") is None
