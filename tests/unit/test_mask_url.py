"""Masking passwords in URLs (`ackkit._connection.url.mask_url`, which every log line, CLI table,
connection error and console page goes through): the same result as the regular
expression it replaced, in time linear in the text's length (a hostile header of a
megabyte used to freeze the console: the expression backtracked quadratically)."""

from __future__ import annotations

import re
import subprocess
import sys

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ackkit._connection.url import mask_url
from ackkit.testing._util import mask_secrets

_REFERENCE = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:@/]*):(?P<pw>[^@/]*)@")


def reference(text: str) -> str:
    """The expression mask_url used before (right, but quadratic on hostile text)."""
    return _REFERENCE.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


texts = st.text(alphabet="a1+.-:/@ Zé", max_size=60)


@settings(max_examples=2_000)
@given(text=texts)
@example(text="amqp://guest:guest@127.0.0.1:5672/%2f")
@example(text="1x://u:p@h a://b://c:d@e")
@example(text="see amqp://app:s3cret@db/prod and amqps://x:y@z")
@example(text="://u:p@h")
def test_masks_exactly_what_the_expression_masked(text: str) -> None:
    assert mask_url(text) == reference(text)
    assert mask_secrets(text) == reference(text)


@given(
    user=st.text(alphabet="abc._-", max_size=8),
    password=st.text(alphabet="pqr$!%", min_size=1, max_size=12),
    around=st.text(alphabet="xy .,;", max_size=20),
)
def test_a_password_never_shows(user: str, password: str, around: str) -> None:
    text = f"{around}amqp://{user}:{password}@host/vh{around}"
    out = mask_url(text)
    assert f"{user}:***@host" in out
    assert f":{password}@" not in out


HOSTILE = {
    "one scheme run of a megabyte": '"a" * 1_000_000 + "://u:secret@h/"',
    "a word boundary at every other character": '"a." * 500_000',
    "a scheme at every fourth character": '"a://" * 250_000',
    "users without passwords": '"x://u:" * 170_000',
    "a megabyte of real URLs": '"amqp://u:pw@h/ " * 70_000',
    "a 5 MB body": '"a" * 5_000_000',
}


def test_hostile_megabytes_are_masked_in_linear_time() -> None:
    """Each in a child process, killed past a ceiling a thousand times above what linear
    time takes here (so load cannot break it; the quadratic expression took minutes and,
    holding the GIL, would hang the test run itself)."""
    code = (
        "import sys\n"
        "from ackkit._connection.url import mask_url\n"
        "from ackkit.testing._util import mask_secrets\n"
        "text = eval(sys.argv[1])\n"
        "out = mask_url(text)\n"
        "assert mask_secrets(text) == out\n"
        "print(out.count(':***@'))\n"
    )
    counts = {}
    for what, expr in HOSTILE.items():
        try:
            done = subprocess.run(
                [sys.executable, "-c", code, expr], capture_output=True, text=True, timeout=60
            )
        except subprocess.TimeoutExpired:
            raise AssertionError(f"masking {what} took over 60 s") from None
        assert done.returncode == 0, done.stderr
        counts[what] = int(done.stdout)
    assert counts["one scheme run of a megabyte"] == 1
    assert counts["a megabyte of real URLs"] == 70_000
