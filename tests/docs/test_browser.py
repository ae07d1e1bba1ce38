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
        ("guide/failures/", "Failures, retry and the dead-letter queue"),
        ("reference/api/", "API reference"),
    ],
)
def test_page_renders_with_navigation(page: Any, site_url: str, path: str, heading: str) -> None:
    open_page(page, site_url + path)
    assert page.locator("article h1").first.inner_text().strip(" ¶\n") == heading
    titles = nav_titles(page)
    for section in ("Getting started", "User guide", "Recipes", "Reference", "How it works"):
        assert any(section in t for t in titles), (section, titles)
    assert page.errors == []
    if path == "reference/api/":
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
    results.first.locator("a").first.click()
    page.wait_for_load_state("networkidle")
    assert page.url.startswith(site_url) and page.url != site_url
    assert page.errors == []
