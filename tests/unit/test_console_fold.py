"""The console's error-message fold: a hyphen or plus inside a word is text, not a sign."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit.console._groups import MESSAGE_MAX, normalise

word = st.text(alphabet="ghijklmnopqrstuvwxyzGHIJKLMNOPQRSTUVWXYZ_", min_size=1, max_size=10)
"""A word no fold touches (no digits, quotes, or hex letters that could make an id)."""
number = st.integers(min_value=0, max_value=10**12).map(str)
signs_and_digits = st.text(alphabet="ab-+_ 0123456789.eE'\"xf", max_size=80)
"""Messages dense in what the number and sign rules look at."""


def test_a_hyphen_inside_a_word_is_kept() -> None:
    assert normalise("order ord-00058 not found") == "order ord-# not found"
    assert normalise("ord-00058") == normalise("ord-91") == "ord-#"
    assert normalise("ord-deadbeef12") == "ord-#"
    assert normalise("retry x+1") == "retry x+#"
    # a sign where no word character comes before it is still a sign
    assert normalise("balance -12.5 below 0") == "balance # below #"
    assert normalise("-5") == normalise("+5") == normalise("5") == "#"
    assert normalise("range 5-3") == "range #-#"


@settings(max_examples=200)
@given(word, st.sampled_from("-+"), number, number)
def test_word_joined_to_a_number_keeps_its_joiner(w: str, joiner: str, a: str, b: str) -> None:
    folded = normalise(f"id {w}{joiner}{a} gone")
    assert folded == f"id {w}{joiner}# gone"
    assert normalise(f"id {w}{joiner}{b} gone") == folded  # one group, whatever the number


@settings(max_examples=300)
@given(st.one_of(signs_and_digits, st.text(max_size=300)))
def test_normalise_stays_idempotent_bounded_and_without_digits(message: str) -> None:
    once = normalise(message)
    assert normalise(once) == once
    assert len(once) <= MESSAGE_MAX
    assert not re.search(r"\d", once)
