"""The built site as a reader sees it: headless Chromium (the system's, /usr/bin/chromium,
driven by Playwright; no browser download) on a loopback http.server. The home page,
a guide page and the API reference render with their navigation and log no console
error; the site's search finds "dead letter". Saves the home page's screenshot
(docs/images/home.png, shown in the README) when ACKKIT_DOCS_SCREENSHOT=1."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from ._blocks import DOCS

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("ACKKIT_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="module")
def site_url(built_site: Path) -> Iterator[str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(built_site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install 'ackkit[docs]'")
    if not shutil.which(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.errors = []  # console errors and uncaught exceptions, as the reader's console shows them
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    try:
        yield page
    finally:
        page.close()


def open_page(page: Any, url: str) -> None:
    resp = page.goto(url, wait_until="networkidle")
    assert resp is not None and resp.status == 200, url


def nav_titles(page: Any) -> list[str]:
    return [t.strip() for t in page.locator("nav.md-nav--primary .md-nav__link").all_inner_texts()]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("path", "heading"),
    [
        ("", "ackkit"),
        ("guide/failures.html", "Failures, retry and the dead-letter queue"),
        ("reference/api.html", "API reference"),
    ],
)
def test_page_renders_with_navigation(page: Any, site_url: str, path: str, heading: str) -> None:
    open_page(page, site_url + path)
    assert page.locator("article h1").first.inner_text().strip(" ¶\n") == heading
    titles = nav_titles(page)
    for section in ("Getting started", "User guide", "Recipes", "Reference", "How it works"):
        assert any(section in t for t in titles), (section, titles)
    assert page.errors == []
    if path == "reference/api.html":
        # the reference is generated: a class with its signature and docstring
        assert page.locator("[id='ackkit.App']").count() == 1
        assert "InMemoryBroker" in page.locator("article").inner_text()
    if path == "" and os.environ.get("ACKKIT_DOCS_SCREENSHOT") == "1":
        (DOCS / "images").mkdir(exist_ok=True)
        page.screenshot(path=str(DOCS / "images" / "home.png"))


@pytest.mark.timeout(120)
def test_search_finds_dead_letter(page: Any, site_url: str) -> None:
    open_page(page, site_url)
    box = page.locator("input.md-search__input")
    box.click()
    box.press_sequentially("dead letter", delay=50)
    results = page.locator(".md-search-result__item")
    results.first.wait_for(timeout=15000)
    assert results.count() >= 3
    text = page.locator(".md-search-result").inner_text().lower()
    assert "dead" in text and "letter" in text
    start = page.url
    results.first.locator("a").first.click()
    # the click only starts the navigation: wait for the page it leads to
    page.wait_for_url(lambda url: url != start, timeout=15000)
    page.wait_for_load_state("networkidle")
    assert page.url.startswith(site_url) and page.url != site_url
    assert page.errors == []


# The site as the README says to open it: site/index.html from disk (file://), no server.
@pytest.mark.timeout(120)
def test_the_site_opened_from_disk_follows_its_navigation(page: Any, built_site: Path) -> None:
    """A nav link leads to the guide page itself (file://.../guide/failures.html), not
    to the browser's listing of a directory (file://.../guide/failures/)."""
    open_page(page, (built_site / "index.html").as_uri())
    page.locator(
        "nav.md-nav--primary a.md-nav__link", has_text="Failures, retry and the DLQ"
    ).first.click()
    page.wait_for_url(lambda url: "failures" in url, timeout=15000)
    page.wait_for_load_state("load")
    assert page.url.startswith("file://") and page.url.endswith(".html"), page.url
    assert page.locator("article h1").first.inner_text().strip(" ¶\n") == (
        "Failures, retry and the dead-letter queue"
    )
    titles = nav_titles(page)
    assert any("User guide" in t for t in titles), titles
    # and every link of the navigation leads to a page's file, none to a directory
    hrefs = page.eval_on_selector_all(
        "nav.md-nav--primary a.md-nav__link[href]", "as => as.map(a => a.href)"
    )
    paths = {unquote(urlsplit(h).path) for h in hrefs if h.startswith("file://")}
    assert len(paths) > 30
    assert all(Path(p).is_file() for p in paths), sorted(p for p in paths if not Path(p).is_file())
    assert page.errors == []


@pytest.mark.timeout(120)
def test_search_works_on_the_site_opened_from_disk(page: Any, built_site: Path) -> None:
    """From file:// too: no worker may start there and no index may be fetched, so the
    index comes as a script and the worker runs in a frame (docs/javascripts/)."""
    open_page(page, (built_site / "guide" / "handlers.html").as_uri())
    box = page.locator("input.md-search__input")
    box.click()
    box.press_sequentially("dead letter", delay=50)
    results = page.locator(".md-search-result__item")
    results.first.wait_for(timeout=15000)
    assert results.count() >= 3
    start = page.url
    results.first.locator("a").first.click()
    page.wait_for_url(lambda url: url != start, timeout=15000)
    page.wait_for_load_state("load")
    assert page.url.startswith("file://") and ".html" in page.url, page.url
    assert page.errors == []


@pytest.mark.timeout(120)
def test_search_finds_a_dotted_name(page: Any, site_url: str) -> None:
    """AckMode.MANUAL as written in the code (the search's separator keeps the dot)."""
    open_page(page, site_url)
    box = page.locator("input.md-search__input")
    box.click()
    box.press_sequentially("AckMode.MANUAL", delay=50)
    results = page.locator(".md-search-result__item")
    results.first.wait_for(timeout=15000)
    assert "ackmode.manual" in page.locator(".md-search-result").inner_text().lower()
    assert page.errors == []
