"""The console in a real browser (headless Chromium driven by Playwright) on a real broker.

A service dead-letters three kinds of failure; the console shows three groups with the
right counts; after the handler is fixed for one kind, that group is replayed from the
browser, and the broker shows the DLQ lower by exactly that group and the service
handled those messages. CI must install Debian's `chromium` package (and the Python
package playwright; `playwright install` is not needed)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from _console_support import KINDS, failing_service, publish_kinds, served
from _retry_support import wait_until

from ackkit import App
from ackkit.console import Holder, Store

CHROMIUM = os.environ.get("ACKKIT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason=f"no Chromium at {CHROMIUM} (apt-get install chromium, or set ACKKIT_CHROMIUM)",
    ),
]
TOTAL = sum(KINDS.values())


@pytest.fixture
def browser() -> Any:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    sync_api.expect.set_options(timeout=15_000)
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


def test_three_groups_seen_and_one_replayed_from_the_browser(
    rabbitmq: Any, fresh_queue: str, browser: Any
) -> None:
    expect = pytest.importorskip("playwright.sync_api").expect
    q, dlq = fresh_queue, f"{fresh_queue}.dlq"
    fixed: set[str] = set()
    handled: list[str] = []
    app = App(rabbitmq.url)
    failing_service(app, q, fixed, handled)
    with app.running():
        publish_kinds(rabbitmq.url, q)
        rabbitmq.wait_for(dlq, ready=TOTAL, timeout=30)
        rabbitmq.wait_for(q, ready=0, unacked=0)

        holder = Holder(rabbitmq.url, [dlq], Store([dlq]))
        holder.start()
        try:
            with served(holder) as base:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                assert wait_until(lambda: holder.store.held(dlq) == TOTAL, timeout=15)
                page.goto(f"{base}/")
                card = page.locator(f".dlq[data-dlq='{dlq}'] .count")
                assert card.inner_text() == str(TOTAL)
                assert page.locator("svg.chart rect").count() >= 1

                # a click starts a navigation and returns: every read after one waits for
                # what the new page shows (expect), never reads the page it left
                page.click("text=Failure groups")
                page.wait_for_url(f"{base}/groups")
                rows = page.locator("tr.group-row")
                expect(rows).to_have_count(3)
                seen = {
                    rows.nth(i).locator("code").inner_text(): int(
                        rows.nth(i).locator("td.count").inner_text()
                    )
                    for i in range(3)
                }
                assert seen == {"KeyError": 7, "ValueError": 5, "TimeoutError": 3}
                # the price failures: one group however their numbers differ
                price = rows.filter(has_text="ValueError")
                assert "bad price # for order #" in price.inner_text()

                fixed.add("price")  # the fix is deployed
                price.locator("a").click()
                expect(page.locator(".group-count")).to_have_text("5")
                page.click("#replay-group")
                expect(page.locator("#confirm")).to_contain_text("Yes, replay 5 dead letters")
                page.click("#confirm")
                expect(page.locator("#result")).to_have_text(re.compile(r"^replay: 5 of 5 \(5 to "))

                # on the broker: the DLQ is lower by exactly that group, the service handled it
                rabbitmq.wait_for(dlq, total=TOTAL - 5, timeout=15)
                assert wait_until(lambda: len(handled) == 5, timeout=15)
                assert sorted(handled) == sorted(f"price-{i}" for i in range(5))
                rabbitmq.wait_for(q, ready=0, unacked=0)

                page.goto(f"{base}/groups")
                expect(page.locator("tr.group-row")).to_have_count(2)  # the other two are left
                page.click("text=Audit log")
                page.wait_for_url(re.compile(r".*/audit.*"))
                expect(page.locator("table")).to_contain_text("replay")
                expect(page.locator("table")).to_contain_text("5 of 5")
        finally:
            holder.stop()
    # the console gone, the other dead letters are back in the queue, nothing lost
    rabbitmq.wait_for(dlq, ready=TOTAL - 5, unacked=0)
