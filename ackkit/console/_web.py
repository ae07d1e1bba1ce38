"""The console's pages and actions (Starlette, Jinja2 with autoescape, no JavaScript).

Every page is made on a worker thread (Starlette runs a plain `def` endpoint in its
thread pool; the async ones hand their rendering over with `run_in_threadpool`): the
event loop only reads requests and writes responses, so a page that takes long (a huge
dead letter, thousands of groups) holds up no other request. What the pages read, they
read through the store's lock or from values that do not change once held."""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from .._connection.url import mask_url
from .._core import checks as C
from . import _render as R
from ._holder import Counts
from ._security import COOKIE, SECURITY_HEADERS, Access
from ._store import SORTS

Next = Callable[[Request], Awaitable[Response]]
audit_log = logging.getLogger("ackkit.console.audit")
PAGE = 200
"""Dead letters listed per page of a group."""
GROUPS_PAGE = 500
"""Failure groups listed per page of the group list."""
ACTIONS = ("replay", "delete")
DRY_RUN_WAIT = 120.0
"""Seconds a dry run waits for the holder's thread (the passive declares)."""


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("ackkit.console", "templates"),
        autoescape=True,  # every value is escaped: a body "<script>" is shown as text
        undefined=jinja2.StrictUndefined,
    )
    env.filters["when"] = R.when
    return env


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def create_app(holder: Any, access: Access | None = None, *, title: str = "") -> Starlette:
    """The console's ASGI app over a holder (`Holder`, or any object with its `store`,
    `replay`, `delete`, `dry_run`, `ready_counts` and `url`; `safe_url` if it has one)."""
    access = access or Access()
    env = _env()
    store = holder.store
    shown_url = getattr(holder, "safe_url", None) or mask_url(holder.url)  # every node

    def counts(q: str) -> Any:
        if hasattr(holder, "counts"):
            return holder.counts(q)
        return Counts(store.held(q), 0, holder.ready_counts.get(q), None, False)

    def page(request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        busy = [(q, c) for q in store.dlqs if (c := counts(q)).indexing]
        html = env.get_template(name).render(
            indexing=busy,
            csrf=access.csrf(),
            read_only=access.read_only,
            url=shown_url,
            title=title,
            who=request.state.who,
            **ctx,
        )
        return HTMLResponse(html, status)

    def overview(request: Request) -> Response:
        dlqs = store.overview()
        cards = []
        for d in dlqs:
            step, bars = R.chart(d.seconds)
            cards.append({"d": d, "n": counts(d.name), "bars": bars, "step": step})
        top = store.groups()[:10]
        return page(request, "overview.html", cards=cards, groups=top, errors=store.errors[-5:])

    def groups(request: Request) -> Response:
        q = request.query_params
        dlq = q.get("dlq") or None
        sort = q.get("sort") or "count"
        if sort not in SORTS:
            raise HttpError(400, f"sort must be one of {', '.join(SORTS)}")
        search = (q.get("q") or "")[:200]
        found = store.groups(dlq, sort=sort, search=search)
        n = _int(q.get("page", "0"))
        return page(
            request,
            "groups.html",
            groups=found[n * GROUPS_PAGE : (n + 1) * GROUPS_PAGE],
            found=len(found),
            dlq=dlq,
            sort=sort,
            search=search,
            page_no=n,
            pages=-(-len(found) // GROUPS_PAGE),
            link=lambda **kw: (
                "/groups?"
                + urllib.parse.urlencode(
                    {k: v for k, v in {"dlq": dlq, "q": search, "sort": sort, **kw}.items() if v}
                )
            ),
        )

    def group(request: Request) -> Response:
        gid = request.path_params["gid"]
        n = _int(request.query_params.get("page", "0"))
        try:
            view, members = store.group(gid, n * PAGE, PAGE)
        except KeyError:
            raise HttpError(404, "no such failure group (it may have been replayed)") from None
        return page(
            request, "group.html", g=view, members=members, page_no=n, pages=-(-view.count // PAGE)
        )

    def letter(request: Request) -> Response:
        e = store.entry(_int(request.path_params["lid"]))
        if e is None:
            raise HttpError(404, "no such dead letter (it may have been replayed or deleted)")
        return page(
            request,
            "letter.html",
            e=e,
            body=R.body_view(e.body),
            props=R.properties(e.props),
            headers=R.headers(e.props),
            traceback=R.traceback_text(e.props),
            history=store.history_of(e.dl.message_id),
        )

    async def confirm(request: Request) -> Response:
        form = await _post(request)
        action, ids, what, to = await run_in_threadpool(_scope, store, form)
        return await run_in_threadpool(
            page,
            request,
            "confirm.html",
            action=action,
            ids=ids,
            what=what,
            to=to,
            form=form,
            dry_run_query=_dry_run_query(form, ids, to),
        )

    def dry_run(request: Request) -> Response:
        """What a replay would do (where to, how many, whether those queues exist),
        changing nothing: a GET, also on a read-only console."""
        q = request.query_params
        form: dict[str, Any] = {k: q.get(k) for k in ("scope", "group", "to", "upto")}
        form["action"], form["ids"] = "replay", q.getlist("ids")
        _action, ids, what, to = _scope(store, form)
        plan = holder.dry_run(ids, to or None).result(timeout=DRY_RUN_WAIT)
        return page(request, "dry_run.html", plan=plan, what=what, to=to, form=form, ids=ids)

    async def act(request: Request) -> Response:
        form = await _post(request)
        action, ids, what, to = await run_in_threadpool(_scope, store, form)
        who = f"{request.state.who}@{request.client.host if request.client else '?'}"

        def start() -> Any:  # claims every dead letter of the action: off the loop too
            if action == "replay":
                return holder.replay(ids, to or None, who)
            return holder.delete(ids, who)

        res = await asyncio.wrap_future(await run_in_threadpool(start))
        target = f" to {to}" if to else (" to source queues" if action == "replay" else "")
        line = store.log(who, action, f"{what}{target}", res.summary())
        audit_log.info("who=%s action=%s what=%r result=%r", who, action, line.what, line.result)
        return await run_in_threadpool(page, request, "result.html", res=res, what=what, line=line)

    def export(request: Request) -> Response:
        q = request.query_params
        if q.get("group"):
            ids = store.group_ids(q["group"])
            name = f"group-{q['group']}"
        elif q.get("dlq") in store.dlqs:
            ids = store.dlq_ids(q["dlq"])
            name = q["dlq"]
        else:
            raise HttpError(400, "export needs ?group=ID or ?dlq=NAME")

        def lines() -> Iterator[bytes]:  # Starlette takes each line on a worker thread
            for i in ids:
                e = store.entry(i)
                if e is not None:
                    yield (R.export_line(e) + "\n").encode()

        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        return StreamingResponse(
            lines(),
            media_type="application/x-ndjson",
            headers={"content-disposition": f'attachment; filename="{safe}.jsonl"'},
        )

    def audit(request: Request) -> Response:
        return page(request, "audit.html", lines=list(reversed(store.audit[-500:])))

    async def _post(request: Request) -> dict[str, Any]:
        if access.read_only:
            raise HttpError(403, "the console is read-only (started with --read-only)")
        origin = request.headers.get("origin")
        if origin not in (None, "null") and (
            urllib.parse.urlsplit(origin).netloc != request.headers.get("host")
        ):
            raise HttpError(403, "cross-site request refused (Origin is not this console)")
        form = await request.form()
        if not access.check_csrf(_str(form.get("csrf"))):
            raise HttpError(403, "missing or wrong CSRF token: reload the page and try again")
        keys = ("action", "scope", "group", "to", "upto")
        out: dict[str, Any] = {k: form.get(k) for k in keys}
        out["ids"] = form.getlist("ids")
        return out

    routes = [
        Route("/", overview),
        Route("/groups", groups),
        Route("/group/{gid}", group),
        Route("/letter/{lid}", letter),
        Route("/dry-run", dry_run),
        Route("/confirm", confirm, methods=["POST"]),
        Route("/act", act, methods=["POST"]),
        Route("/export", export),
        Route("/audit", audit),
    ]

    def failed(request: Request, exc: Exception) -> Response:
        if isinstance(exc, HttpError):
            return page(request, "error.html", exc.status, message=exc.message)
        return page(request, "error.html", 400, message=str(exc))  # a bad queue name, ...

    async def guard(request: Request, call_next: Next) -> Response:
        token = request.query_params.get("token")
        who = access.who(request.headers.get("authorization"), request.cookies.get(COOKIE), token)
        request.state.who = who or "-"
        if who is None:
            response: Response = _unauthorized(access)
        elif token is not None and access.token is not None:
            # the token once in the URL, then a cookie: it leaves the address bar
            response = RedirectResponse(request.url.remove_query_params("token"), 303)
            response.set_cookie(COOKIE, access.session(), httponly=True, samesite="strict")
        else:
            response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    app = Starlette(
        routes=routes,
        exception_handlers={HttpError: failed, ValueError: failed},
        middleware=[
            Middleware(TrustedHostMiddleware, allowed_hosts=access.hosts()),
            Middleware(BaseHTTPMiddleware, dispatch=guard),
        ],
    )

    return app


def _unauthorized(access: Access) -> Response:
    text = "Authentication needed: open the console's address with ?token=... once"
    headers = {}
    if access.basic is not None:
        text = "Authentication needed (basic auth)"
        headers["www-authenticate"] = 'Basic realm="ackkit console", charset="UTF-8"'
    return Response(text, 401, headers=headers, media_type="text/plain")


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _int(text: Any) -> int:
    try:
        n = int(text)
    except (TypeError, ValueError):
        raise HttpError(400, f"not a number: {str(text)[:40]!r}") from None
    if n < 0:
        raise HttpError(400, "a negative number")
    return n


def _dry_run_query(form: dict[str, Any], ids: list[int], to: str) -> str:
    """The dry run of what a confirmation page is about to do, as a query string."""
    q: list[tuple[str, Any]] = [("scope", form.get("scope"))]
    if form.get("scope") == "group":
        q += [("group", form.get("group")), ("upto", max(ids, default=0))]
    else:
        q += [("ids", i) for i in ids]
    if to:
        q.append(("to", to))
    return urllib.parse.urlencode(q)


def _scope(store: Any, form: dict[str, Any]) -> tuple[str, list[int], str, str]:
    """(action, dead-letter ids, what they are in words, target queue or "")."""
    action = _str(form.get("action"))
    if action not in ACTIONS:
        raise HttpError(400, f"action must be one of {', '.join(ACTIONS)}")
    to = (_str(form.get("to")) or "").strip()
    if to:
        C.queue_name("to", to, declared=False)
    if action == "delete" and to:
        raise HttpError(400, "delete takes no target queue")
    scope = _str(form.get("scope"))
    if scope == "group":
        gid = _str(form.get("group")) or ""
        ids = store.group_ids(gid)
        if form.get("upto"):  # what the confirmation showed: not what arrived since
            upto = _int(form["upto"])
            ids = [i for i in ids if i <= upto]
        try:
            view, _ = store.group(gid, 0, 0)
        except KeyError:
            raise HttpError(404, "no such failure group (it may have been replayed)") from None
        what = f"group {view.key.error_type}: {view.key.message} ({len(ids)} dead letters)"
    elif scope == "selection":
        ids = sorted({_int(i) for i in form.get("ids") or []})
        if not ids:
            raise HttpError(400, "nothing selected")
        what = f"{len(ids)} selected dead letter{'s' if len(ids) != 1 else ''}"
    else:
        raise HttpError(400, "scope must be group or selection")
    return action, ids, what, to
