"""The console's pages and actions over HTTP (Starlette's TestClient, no broker):
escaping, CSRF, read-only, authentication outside loopback, masked passwords."""

from __future__ import annotations

import base64
import json
import re
from concurrent.futures import Future
from typing import Any

import pika
import pytest

pytest.importorskip("starlette", reason="the console extra is not installed")
from starlette.testclient import TestClient

from ackkit._core import headers as H
from ackkit.console import Access, ActionResult, Store, create_app, group_key
from ackkit.dead_letters._letter import describe

URL = "amqp://ops:s3cret-pw@127.0.0.1:5672/%2f"
DLQ = "orders.dlq"
EVIL = "<script>alert('x')</script>"


class FakeHolder:
    """The holder's interface over a Store; settling only forgets (no broker here)."""

    def __init__(self) -> None:
        self.url = URL
        self.store = Store([DLQ])
        self.ready_counts: dict[str, int | None] = {DLQ: 0}
        self.settled: list[tuple[str, list[int], str | None, str]] = []

    def add(
        self, n: int, error: str, message: str, body: bytes = b'{"a": 1}', replayed: int = 0
    ) -> list[int]:
        ids = []
        for i in range(n):
            h = {
                H.REASON: "attempts exhausted (3 of 3)",
                H.ERROR_TYPE: error,
                H.ERROR_MESSAGE: message.format(i=i),
                H.ERROR_TRACEBACK: f"Traceback ...\n{error}: {EVIL}",
                H.LISTENER: "orders",
                H.ORIGINAL_QUEUE: "orders",
                H.ATTEMPTS: 3,
                H.DEAD_LETTERED_AT: "2026-11-26T06:00:00+00:00",
                "x-link": URL,
            }
            if replayed:
                h[H.REPLAYED] = replayed
            props = pika.BasicProperties(headers=h, message_id=f"{error}-{i}")
            dl = describe(h, message_id=props.message_id, body_size=len(body))
            e = self.store.add(DLQ, 0, 1, None, dl, props, body, group_key(DLQ, dl))
            ids.append(e.id)
        return ids

    def _settle(self, action: str, ids: Any, to: str | None, who: str) -> Future[ActionResult]:
        entries = self.store.claim(list(ids))
        self.store.remove(e.id for e in entries)
        self.settled.append((action, [e.id for e in entries], to, who))
        fut: Future[ActionResult] = Future()
        fut.set_result(ActionResult(action, len(list(ids)), done=len(entries)))
        return fut

    def replay(self, ids: Any, to: str | None = None, who: str = "?") -> Future[ActionResult]:
        return self._settle("replay", ids, to, who)

    def delete(self, ids: Any, who: str = "?") -> Future[ActionResult]:
        return self._settle("delete", ids, None, who)


def client(holder: FakeHolder, access: Access | None = None, **kw: Any) -> TestClient:
    return TestClient(create_app(holder, access), base_url="http://127.0.0.1:8470", **kw)


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert m, "no CSRF token on the page"
    return m.group(1)


@pytest.fixture
def holder() -> FakeHolder:
    h = FakeHolder()
    h.add(3, "KeyError", "'sku-{i}'")
    h.add(2, "ValueError", "bad price {i}")
    return h


def test_overview_and_groups_show_counts_with_the_password_masked(holder: FakeHolder) -> None:
    c = client(holder)
    page = c.get("/").text
    assert DLQ in page and ">5<" in page.replace(" ", "")
    groups = c.get("/groups").text
    assert "KeyError" in groups and "&#39;…&#39;" in groups  # the folded message, escaped
    counts = re.findall(r'class="num count">(\d+)<', groups)
    assert sorted(map(int, counts)) == [2, 3]
    for p in (page, groups):
        assert "s3cret-pw" not in p and "ops:***@" in p
    gid = group_key(DLQ, holder.store.entry(1).dl).id  # type: ignore[union-attr]
    g = c.get(f"/group/{gid}").text
    assert g.count('name="ids"') == 3
    letter = c.get("/letter/1").text
    assert "s3cret-pw" not in letter  # the URL in a header is masked too


def test_a_script_body_and_error_are_shown_as_text(holder: FakeHolder) -> None:
    (i,) = holder.add(1, "RuntimeError", EVIL, body=EVIL.encode())
    c = client(holder)
    page = c.get(f"/letter/{i}").text
    assert "<script>" not in page
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page  # body, message, traceback
    assert page.count("&lt;script&gt;") >= 3
    groups = c.get("/groups").text
    assert "<script>" not in groups
    resp = c.get("/")
    assert "script-src" not in resp.headers["content-security-policy"]  # no script may run
    assert "default-src 'none'" in resp.headers["content-security-policy"]
    assert resp.headers["x-frame-options"] == "DENY"


def test_binary_body_is_a_hex_dump_and_json_is_pretty(holder: FakeHolder) -> None:
    (b,) = holder.add(1, "E", "x", body=b"\xff\x00\x01ab")
    c = client(holder)
    assert "ff 00 01 61 62" in c.get(f"/letter/{b}").text
    assert "{\n  &#34;a&#34;: 1\n}" in c.get("/letter/1").text


def test_actions_refuse_a_missing_or_wrong_csrf_token(holder: FakeHolder) -> None:
    c = client(holder)
    form = {"action": "delete", "scope": "selection", "ids": ["1", "2"]}
    assert c.post("/act", data=form).status_code == 403
    assert c.post("/act", data={**form, "csrf": "0" * 64}).status_code == 403
    token = csrf_of(c.get("/letter/1").text)
    evil = c.post("/act", data={**form, "csrf": token}, headers={"origin": "http://evil.test"})
    assert evil.status_code == 403
    assert holder.settled == [] and holder.store.entry(1) is not None
    ok = c.post("/act", data={**form, "csrf": token})
    assert ok.status_code == 200 and "delete: 2 of 2" in ok.text
    assert holder.settled == [("delete", [1, 2], None, "local@testclient")]
    audit = c.get("/audit").text
    assert "local@testclient" in audit and "2 selected dead letters" in audit


def test_confirmation_page_does_nothing_until_confirmed(holder: FakeHolder) -> None:
    c = client(holder)
    gid = holder.store.groups()[0].id
    token = csrf_of(c.get(f"/group/{gid}").text)
    form = {"action": "replay", "scope": "group", "group": gid, "to": "", "csrf": token}
    page = c.post("/confirm", data=form).text
    assert "Yes, replay 3 dead letters" in page and holder.settled == []
    upto = re.search(r'name="upto" value="(\d+)"', page)
    assert upto
    holder.add(1, "KeyError", "'sku-late'")  # arrives after the confirmation was shown
    assert c.post("/act", data={**form, "upto": upto.group(1)}).status_code == 200
    assert holder.settled[0][0] == "replay" and len(holder.settled[0][1]) == 3  # not 4
    bad = c.post("/confirm", data={**form, "to": "bad\nname"})
    assert bad.status_code == 400


def test_read_only_has_no_action_and_refuses_posts(holder: FakeHolder) -> None:
    access = Access(read_only=True)
    c = client(holder, access)
    gid = holder.store.groups()[0].id
    page = c.get(f"/group/{gid}").text
    assert 'name="action"' not in page and 'name="ids"' not in page
    assert page.count("<button") == 1 and 'id="dry-run-group"' in page  # changes nothing
    form = {"action": "delete", "scope": "selection", "ids": ["1"], "csrf": access.csrf()}
    for path in ("/act", "/confirm"):
        resp = c.post(path, data=form)
        assert resp.status_code == 403 and "started with --read-only" in resp.text
    assert holder.settled == []


def test_outside_loopback_authentication_is_required() -> None:
    with pytest.raises(ValueError, match="without authentication"):
        Access(host="0.0.0.0")
    with pytest.raises(ValueError, match="at least 16"):
        Access(host="0.0.0.0", token="short")
    Access(host="::1")  # loopback: fine without
    Access(host="localhost")


def test_token_then_cookie(holder: FakeHolder) -> None:
    token = "t" * 24
    c = client(holder, Access(host="0.0.0.0", token=token), follow_redirects=False)
    assert c.get("/").status_code == 401
    assert c.get("/", headers={"authorization": "Bearer wrong"}).status_code == 401
    assert c.get("/", headers={"authorization": f"Bearer {token}"}).status_code == 200
    r = c.get(f"/groups?token={token}")
    assert r.status_code == 303 and "token" not in r.headers["location"]
    assert c.get("/groups").status_code == 200  # the cookie now


def test_basic_auth_names_who_acted(holder: FakeHolder) -> None:
    access = Access(host="0.0.0.0", basic=("alice", "correct horse"))
    c = client(holder, access)
    assert c.get("/").status_code == 401
    assert c.get("/").headers["www-authenticate"].startswith("Basic")
    auth = {"authorization": "Basic " + base64.b64encode(b"alice:correct horse").decode()}
    page = c.get("/letter/1", headers=auth).text
    form = {"action": "delete", "scope": "selection", "ids": ["1"], "csrf": csrf_of(page)}
    assert c.post("/act", data=form, headers=auth).status_code == 200
    assert holder.settled[0][3] == "alice@testclient"


def test_loopback_console_refuses_other_host_names(holder: FakeHolder) -> None:
    """DNS rebinding: a page of evil.test that resolves to 127.0.0.1 cannot read it."""
    c = TestClient(create_app(holder), base_url="http://evil.test:8470")
    assert c.get("/").status_code == 400


def test_export_is_json_lines_of_the_group(holder: FakeHolder) -> None:
    holder.add(1, "BinErr", "x", body=b"\xff")
    c = client(holder)
    gid = holder.store.groups()[0].id
    lines = [json.loads(x) for x in c.get(f"/export?group={gid}").text.splitlines()]
    assert len(lines) == 3 and lines[0]["body"] == {"text": '{"a": 1}'}
    assert lines[0]["dead_letter"]["error_type"] == "KeyError"
    all_ = c.get(f"/export?dlq={DLQ}").text.splitlines()
    assert len(all_) == 6 and json.loads(all_[-1])["body"] == {"base64": "/w=="}


def test_cli_refuses_a_public_host_without_auth(capsys: pytest.CaptureFixture[str]) -> None:
    from ackkit.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["console", "--host", "0.0.0.0", "--dlq", "x.dlq", "--url", URL])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "without authentication" in err and "s3cret-pw" not in err


def test_a_group_that_came_back_after_a_replay_is_marked(holder: FakeHolder) -> None:
    c = client(holder)
    assert "came back after replay" not in c.get("/groups").text
    (i,) = holder.add(1, "KeyError", "'sku-9'", replayed=2)  # replayed twice, failed again
    row = next(r for r in c.get("/groups").text.split("<tr") if "KeyError" in r)
    assert "came back after replay" in row
    assert "replayed 2 times before it failed again" in c.get(f"/letter/{i}").text


def test_options_from_an_app_name_its_dead_letter_queues(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ackkit.console._serve import from_options

    (tmp_path / "console_demo_app.py").write_text(
        "from ackkit import App, Delivery\n"
        f"app = App({URL!r})\n"
        "@app.listener('orders')\n"
        "def orders(d: Delivery) -> None: ...\n"
        "@app.listener('billing')\n"
        "def billing(d: Delivery) -> None: ...\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    url, dlqs, access = from_options(
        url=None, dlqs=[], app_target="console_demo_app:app", host="127.0.0.1",
        token=None, basic_auth=None, read_only=True,
    )  # fmt: skip
    assert (url, dlqs, access.read_only) == (URL, ["orders.dlq", "billing.dlq"], True)
    with pytest.raises(ValueError, match="--dlq NAME"):
        from_options(**{**_OPTS, "dlqs": []})
    with pytest.raises(ValueError, match="USER:PASSWORD"):
        from_options(**{**_OPTS, "host": "0.0.0.0", "basic_auth": "alice"})
    with pytest.raises(ValueError, match="at least 8"):
        from_options(**{**_OPTS, "host": "0.0.0.0", "basic_auth": "alice:short"})


_OPTS: dict[str, Any] = {
    "url": URL,
    "dlqs": ["orders.dlq"],
    "app_target": None,
    "host": "127.0.0.1",
    "token": None,
    "basic_auth": None,
    "read_only": False,
}
