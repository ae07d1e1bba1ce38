"""Failure groups on a real broker: a long unbroken error message keeps the count and
time columns on screen (a real browser measures them), groups of thousands sorted,
searched and paged, and a replay's dry run that changes nothing on the broker."""

from __future__ import annotations

import contextlib
import html
import os
import re
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pika
import pytest
from _console_support import served
from _retry_support import wait_until

from ackkit._core import headers as H
from ackkit.console import Holder, Store
from ackkit.testing import QueueNotFound

pytestmark = pytest.mark.integration
CHROMIUM = os.environ.get("ACKKIT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
NOW = datetime.now(UTC)


def letter(
    mid: str,
    error_type: str,
    message: str,
    *,
    listener: str = "orders",
    source: str | None = "orders",
    ago: float = 60.0,
) -> tuple[str, dict[str, Any]]:
    """A dead letter as ackkit's runtimes write it: (message id, headers)."""
    h: dict[str, Any] = {
        H.REASON: "attempts exhausted (3 of 3)",
        H.ERROR_TYPE: error_type,
        H.ERROR_MESSAGE: message,
        H.ATTEMPTS: 3,
        H.LISTENER: listener,
        H.DEAD_LETTERED_AT: (NOW - timedelta(seconds=ago)).isoformat(timespec="milliseconds"),
    }
    if source is not None:
        h[H.ORIGINAL_QUEUE] = source
    return mid, h


def put(url: str, dlq: str, letters: Iterable[tuple[str, dict[str, Any]]]) -> int:
    """Publish the dead letters into `dlq` (declared), confirmed; how many."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(dlq, durable=True)
        n = 0
        for mid, h in letters:
            props = pika.BasicProperties(message_id=mid, headers=h, delivery_mode=2)
            ch.basic_publish("", dlq, b'{"order": 1}', props)
            n += 1
        return n
    finally:
        conn.close()


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as r:
        return str(r.read().decode("utf-8"))


def rows(page: str) -> list[tuple[str, str, int]]:
    """(error type, message, count) of each group row, in order."""
    out = []
    for tr in re.findall(r'<tr class="group-row".*?</tr>', page, re.S):
        etype = re.search(r"<code>(.*?)</code>", tr, re.S)
        msg = re.search(r'<td class="text message">(.*?)</td>', tr, re.S)
        count = re.search(r'<td class="num count">(\d+)</td>', tr)
        assert etype and msg and count, tr
        out.append((html.unescape(etype.group(1)), html.unescape(msg.group(1)), int(count[1])))
    return out


@contextlib.contextmanager
def console(url: str, dlq: str, n: int) -> Iterator[tuple[Holder, str]]:
    """A console holding `dlq` (all `n` of it indexed), served on loopback."""
    holder = Holder(url, [dlq], Store([dlq]))
    holder.start()
    try:
        assert wait_until(lambda: holder.store.held(dlq) == n, timeout=60)
        with served(holder) as base:
            yield holder, base
    finally:
        holder.stop()


# -- a long unbroken message, in a real browser -------------------------------------------


@pytest.fixture
def browser() -> Any:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium, or ACKKIT_CHROMIUM)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


TEXT_LINES = """el => {
    const r = document.createRange(); r.selectNodeContents(el);
    return Array.from(r.getClientRects()).map(b => [b.left, b.right]);
}"""
"""The left and right edge of each line box of an element's text."""


def test_a_long_unbroken_message_keeps_counts_and_times_on_screen(
    rabbitmq: Any, fresh_queue: str, browser: Any
) -> None:
    dlq = f"{fresh_queue}.dlq"
    long = "E" + "x" * 4_999  # 5,000 characters, no space, no digit: nothing folds it
    n = put(
        rabbitmq.url,
        dlq,
        [letter(f"long-{i}", "ValidationError", long) for i in range(3)]
        + [letter(f"short-{i}", "KeyError", f"'sku-{i}'") for i in range(2)],
    )
    width = 1280
    with console(rabbitmq.url, dlq, n) as (_holder, base):
        page = browser.new_page(viewport={"width": width, "height": 800})
        page.goto(f"{base}/groups")
        gid = page.locator("tr.group-row", has_text="ValidationError").get_attribute("data-group")
        for path, cells in (
            ("/", ("td.count", "td.first", "td.last")),
            ("/groups", ("td.count", "td.first", "td.last")),
            (f"/group/{gid}", ("td.when", "td.attempts")),
        ):
            page.goto(base + path)
            row = "tr.group-row" if "group/" not in path else "tr.member"
            assert page.locator(row).count() >= 1
            for sel in cells:
                loc = page.locator(f"{row} {sel}")
                for k in range(loc.count()):
                    box = loc.nth(k).bounding_box()
                    assert box is not None
                    assert box["x"] >= 0 and box["x"] + box["width"] <= width, (path, sel, box)
                    # the text itself: inside the viewport, on one line
                    lines = loc.nth(k).evaluate(TEXT_LINES)
                    assert len(lines) == 1, (path, sel, lines)
                    assert lines[0][0] >= 0 and lines[0][1] <= width, (path, sel, lines)
            assert page.evaluate("document.documentElement.scrollWidth") <= width, path
        # the message is all there (wrapped), the count beside it
        page.goto(f"{base}/groups")
        long_row = page.locator("tr.group-row", has_text="ValidationError")
        assert long_row.locator("td.count").inner_text() == "3"
        assert long_row.locator("td.message").inner_text().startswith("E" + "x" * 150)


# -- sort, search and pages, groups of thousands ---------------------------------------


def _word(i: int) -> str:
    """A word of letters g-z (never a hex id or a number, so no two fold into one)."""
    out = ""
    for _ in range(4):
        out += "ghijklmnopqrstuvwxyz"[i % 20]
        i //= 20
    return out


def test_groups_of_thousands_sorted_searched_and_paged(rabbitmq: Any, fresh_queue: str) -> None:
    dlq = f"{fresh_queue}.dlq"
    many = 1_200
    letters = (
        [letter(f"k{i}", "KeyError", f"'sku-{i}'", ago=3 * 3600) for i in range(5)]
        + [letter(f"t{i}", "TimeoutError", "gateway timed out", ago=2 * 3600) for i in range(3)]
        + [letter(f"v{i}", "ValueError", "bad price", listener="Billing", ago=60) for i in range(2)]
        + [
            letter(f"w{i}", "LookupError", f"no warehouse {_word(i)}", ago=600 + i)
            for i in range(many)
        ]
    )
    n = put(rabbitmq.url, dlq, letters)
    with console(rabbitmq.url, dlq, n) as (_holder, base):

        def groups(**q: Any) -> tuple[list[tuple[str, str, int]], str]:
            page = get(f"{base}/groups?" + urllib.parse.urlencode(q))
            return rows(page), page

        top, page = groups()  # largest first
        assert [r[0] for r in top[:3]] == ["KeyError", "TimeoutError", "ValueError"]
        assert [r[2] for r in top[:3]] == [5, 3, 2]
        assert len(top) == 500 and f"{many + 3} groups" in page

        newest, _ = groups(sort="last")  # last seen, newest first
        assert newest[0][0] == "ValueError"
        assert [r[1] for r in newest[1:4]] == [f"no warehouse {_word(i)}" for i in range(3)]
        last_page, _ = groups(sort="last", page=2)
        assert last_page[-1][0] == "KeyError" and last_page[-2][0] == "TimeoutError"

        # by name, over all pages: the whole list in order, each group once
        by_name = [r for p in range(3) for r in groups(sort="name", page=p)[0]]
        assert len(by_name) == many + 3
        assert by_name == sorted(by_name, key=lambda r: (r[0], r[1]))
        assert len({r[1] for r in by_name if r[0] == "LookupError"}) == many

        # search: message, error type, listener, any case; the count says how many found
        found, page = groups(q="WAREHOUSE " + _word(7))
        assert found == [("LookupError", f"no warehouse {_word(7)}", 1)] and "1 group " in page
        found, page = groups(q="warehouse", sort="name")
        assert len(found) == 500 and f"{many} groups" in page
        assert 'href="/groups?q=warehouse&amp;sort=name&amp;page=1"' in page  # keeps both
        assert [r[0] for r in groups(q="billing")[0]] == ["ValueError"]
        assert [r[0] for r in groups(q="timeouterror")[0]] == ["TimeoutError"]
        assert groups(q="nothing like this")[0] == []
        with pytest.raises(urllib.error.HTTPError) as bad:
            get(f"{base}/groups?sort=size")
        assert bad.value.code == 400
        bad.value.close()


# -- a replay's dry run ---------------------------------------------------------------


def test_dry_run_says_where_and_how_many_and_changes_nothing(
    rabbitmq: Any, queue_factory: Any
) -> None:
    source = queue_factory(declare=True)
    dlq, gone = f"{source}.dlq", f"{source}.gone"
    n = put(
        rabbitmq.url,
        dlq,
        [letter(f"a{i}", "KeyError", f"'sku-{i}'", source=source) for i in range(4)]
        + [letter(f"b{i}", "KeyError", f"'sku-{i}'", source=gone) for i in range(2)]
        + [letter("c0", "KeyError", "'sku-0'", source=None)],
    )
    assert n == 7
    with console(rabbitmq.url, dlq, n) as (holder, base):
        (g,) = holder.store.groups()
        assert g.count == 7

        def dry_run(**q: Any) -> str:
            page = get(f"{base}/dry-run?" + urllib.parse.urlencode({"scope": "group", **q}))
            m = re.search(r'<p id="dry-run-summary">(.*?)</p>', page, re.S)
            assert m, page
            return html.unescape(m.group(1))

        assert dry_run(group=g.id) == (
            f"dry run: 4 of 7 would be replayed (4 to {source}, 2 to {gone} (no such queue: "
            "they would stay in the DLQ)); 1 without a source queue, would stay in the DLQ; "
            "nothing was changed"
        )
        nosuch = f"{source}.nosuch"
        assert dry_run(group=g.id, to=nosuch) == (
            f"dry run: 0 of 7 would be replayed (7 to {nosuch} (no such queue: they would "
            "stay in the DLQ)); nothing was changed"
        )
        assert dry_run(group=g.id, to=source) == (
            f"dry run: 7 of 7 would be replayed (7 to {source}); nothing was changed"
        )

        # on the broker: nothing moved, nothing was declared
        c = rabbitmq.counts(dlq)
        assert (c.total, c.unacked) == (7, 7)
        assert rabbitmq.counts(source).total == 0
        for q in (gone, nosuch):
            with pytest.raises(QueueNotFound):
                rabbitmq.counts(q)
        # in the console: still all held, none claimed, no error from the passive declares
        assert holder.store.held(dlq) == 7 and holder.store.errors == []

        # the plan was right: the replay itself does what the dry run said
        res = holder.replay(holder.store.group_ids(g.id)).result(timeout=60)
        assert (res.done, res.failed, res.no_target) == (4, 2, 1)
        assert res.targets == {source: 4}
        assert rabbitmq.counts(source).total == 4
        assert rabbitmq.counts(dlq).total == 3
