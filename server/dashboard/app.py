"""The web dashboard: a read-only Starlette application, rendered on the server.

Routes (every one a GET; the only one that changes anything is the login
link's redemption, and its token is single-use):

    /login/{token}     redeem a login link: set the session cookie, go to /
    /                  the signed-in tenant's jobs: filter, sort, search, pick jobs to compare; refreshed live
    /jobs.json         the same list as JSON (what the page refreshes from)
    /jobs/{id}         a job: state, duration and ETA, config, live loss chart and events, a chart per metric,
                       workers with their CPU and memory, checkpoints, gossip topology
    /jobs/{id}/stream  server-sent events: the job's loss points, states and events after Last-Event-ID
    /jobs/{id}/metrics the job's metrics history after ``?after=`` (a cursor), as JSON
    /jobs/{id}/logs    the job's worker logs, followed live
    /jobs/{id}/logs/stream  server-sent events: new log lines after Last-Event-ID (lines read, per worker)
    /compare?jobs=A,B  several jobs' metrics overlaid
    /admin             tenants, pending requests, quotas, the queue, the audit log's verdict (admins only)
    /static/...        the one stylesheet and the scripts

A page needs a live session (401 otherwise); a job another tenant owns is 404,
as is /admin for a tenant and any job page for an admin (jobs are their
tenant's, as over gRPC). Templates autoescape everything; the security
headers forbid inline scripts and styles, framing and caching.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Callable
from functools import partial
from importlib import resources

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cantata.security.audit import Action, Outcome
from cantata.server.dashboard.series import TrainingSeries
from cantata.server.dashboard.signin import LoginRefused, Session, SignIn
from cantata.server.dashboard.sweeps import SweepViews
from cantata.server.dashboard.sweeps import state_name as sweep_state_name
from cantata.server.dashboard.views import JobRow, Views
from cantata.server.enrollment import ANONYMOUS
from cantata.server.network.streams import StreamCounter
from cantata.server.store import NotFound

LAST_EVENT_ID = re.compile(r"[0-9]{1,19}")  # a job event's sequence number (SQLite INTEGER): ASCII digits only
LOG_CURSOR = re.compile(r"[0-9]{1,12}(\.[0-9]{1,12}){0,1023}")  # lines read per worker process, dot-separated
LOG_POLL_SECONDS = 1.0  # between looks at a followed job's log files
COOKIE = "__Host-cantata_session"  # __Host-: Secure, path /, no Domain: the browser enforces all three
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        b"base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"strict-transport-security", b"max-age=31536000"),
]


class _CountedStream(StreamingResponse):
    """A streaming response that gives its stream slot back however it ends: sent, failed, or never started."""

    def __init__(self, content: AsyncIterator[str], *, release: Callable[[], None], **kwargs):
        super().__init__(content, **kwargs)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


class SecurityHeaders:
    """ASGI middleware: the same security headers on every response (streams included)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in SECURITY_HEADERS}
                message["headers"] = [(k, v) for k, v in message.get("headers", []) if k not in names] + list(
                    SECURITY_HEADERS
                )
            await send(message)

        await self.app(scope, receive, with_headers)


def _peer(request: Request) -> str:
    """The browser's address as the audit log writes a gRPC peer's (``ipv4:1.2.3.4:5``)."""
    if request.client is None:
        return ""
    host, port = request.client.host, request.client.port
    return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("cantata.server.dashboard", "templates"),
        autoescape=True,  # every template is HTML: tenant-written text is always escaped
        undefined=jinja2.StrictUndefined,
    )


class Dashboard:
    """The application and what its routes need; ``app`` is what uvicorn serves."""

    def __init__(
        self,
        signin: SignIn,
        views: Views,
        series: TrainingSeries,
        audit: Callable[..., object],
        is_allowed: Callable[[Session], bool],
        streams: StreamCounter,
        sweeps: SweepViews | None = None,
    ):
        self._signin = signin
        self._views = views
        self._series = series
        self._audit = audit  # AuditSink.append's signature
        self._is_allowed = is_allowed  # the session's tenant still approved, its certificate not revoked
        self._streams = streams
        self._sweeps = sweeps
        self._templates = _environment()
        static = resources.files("cantata.server.dashboard") / "static"
        self.app = SecurityHeaders(
            Starlette(
                routes=[
                    Route("/login/{token}", self.login),
                    Route("/", self.index),
                    Route("/jobs.json", self.jobs_json),
                    Route("/jobs/{job_id}", self.job),
                    Route("/jobs/{job_id}/stream", self.stream),
                    Route("/jobs/{job_id}/metrics", self.metrics),
                    Route("/jobs/{job_id}/logs", self.logs),
                    Route("/jobs/{job_id}/logs/stream", self.log_stream),
                    Route("/compare", self.compare),
                    Route("/admin", self.admin),
                    Route("/sweeps", self.sweeps),
                    Route("/sweeps/{sweep_id}", self.sweep),
                    Mount("/static", StaticFiles(directory=str(static)), name="static"),
                ],
                exception_handlers={HTTPException: self._error},
            )
        )

    # ---- helpers ---------------------------------------------------------
    def _page(self, template: str, status_code: int = 200, **values) -> HTMLResponse:
        return HTMLResponse(self._templates.get_template(template).render(**values), status_code=status_code)

    async def _error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return self._page("error.html", exc.status_code, session=None, code=exc.status_code, message=exc.detail)

    async def _session(self, request: Request) -> Session:
        session = self._signin.session(request.cookies.get(COOKIE, ""))
        if session is None or not await asyncio.to_thread(self._is_allowed, session):
            raise HTTPException(401, "Not signed in. Run `cantata dashboard --profile NAME` for a login link.")
        return session

    @staticmethod
    def _tenant(session: Session) -> str:
        """The tenant whose jobs the session reads. Jobs are their tenant's alone, as over gRPC: an admin's is 404."""
        if session.is_admin:
            raise HTTPException(404, "No such job.")
        return session.principal.name

    async def _job(self, request: Request, session: Session) -> JobRow:
        """The path's job, if the session's tenant owns it (404 otherwise)."""
        try:
            return await asyncio.to_thread(self._views.job, request.path_params["job_id"], self._tenant(session))
        except NotFound:
            raise HTTPException(404, "No such job.") from None

    def _stream(self, session: Session, lines: AsyncIterator[str]) -> Response:
        """``lines`` as server-sent events, in one of the principal's stream slots (429 when none is free)."""
        who = session.principal.uri
        if not self._streams.acquire(who):
            raise HTTPException(429, "Too many open streams.")
        return _CountedStream(
            lines,
            release=partial(self._streams.release, who),
            media_type="text/event-stream",
            headers={"x-accel-buffering": "no"},
        )

    async def _still_allowed(self, session_id: str) -> bool:
        session = self._signin.session(session_id)
        return session is not None and await asyncio.to_thread(self._is_allowed, session)

    # ---- routes ----------------------------------------------------------
    async def login(self, request: Request) -> Response:
        peer = _peer(request)
        try:
            session_id, session = self._signin.redeem(request.path_params["token"])
        except LoginRefused as refused:
            who = refused.principal
            await asyncio.to_thread(
                self._audit,
                who.uri if who else ANONYMOUS,  # anonymous refusals are counted per address, not one by one
                Action.DASHBOARD_LOGIN,
                tenant=who.name if who and who.role == "tenant" else "",
                outcome=Outcome.REFUSED,
                details={"reason": refused.reason},
                peer=peer,
            )
            raise HTTPException(403, "This login link has expired or was already used. Ask for a new one.") from None
        who = session.principal
        await asyncio.to_thread(
            self._audit, who.uri, Action.DASHBOARD_LOGIN, tenant=who.name if who.role == "tenant" else "", peer=peer
        )
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            COOKIE,
            session_id,
            max_age=int(self._signin.session_seconds),
            path="/",
            secure=True,
            httponly=True,
            samesite="strict",
        )
        return response

    async def index(self, request: Request) -> Response:
        session = await self._session(request)
        if session.is_admin:
            return RedirectResponse("/admin", status_code=303)
        jobs = await asyncio.to_thread(self._views.jobs, self._tenant(session))
        return self._page("jobs.html", session=session, jobs=jobs)

    async def job(self, request: Request) -> Response:
        session = await self._session(request)
        try:
            page = await asyncio.to_thread(self._views.job_page, request.path_params["job_id"], self._tenant(session))
        except NotFound:
            raise HTTPException(404, "No such job.") from None
        return self._page("job.html", session=session, page=page)

    async def jobs_json(self, request: Request) -> Response:
        session = await self._session(request)
        jobs = await asyncio.to_thread(self._views.jobs, self._tenant(session))
        return JSONResponse({"jobs": [j.as_json() for j in jobs]})

    async def sweeps(self, request: Request) -> Response:
        session = await self._session(request)
        if self._sweeps is None:
            raise HTTPException(404, "No sweeps here.")
        found = await asyncio.to_thread(self._sweeps.list, self._tenant(session))
        return self._page("sweeps.html", session=session, sweeps=found, state_name=sweep_state_name)

    async def sweep(self, request: Request) -> Response:
        session = await self._session(request)
        if self._sweeps is None:
            raise HTTPException(404, "No such sweep.")
        try:
            found = await asyncio.to_thread(self._sweeps.detail, request.path_params["sweep_id"], self._tenant(session))
        except NotFound:
            raise HTTPException(404, "No such sweep.") from None
        return self._page("sweep.html", session=session, sweep=found, state_name=sweep_state_name)

    async def stream(self, request: Request) -> Response:
        session = await self._session(request)
        job = await self._job(request, session)
        last = request.headers.get("last-event-id", "0")
        if not LAST_EVENT_ID.fullmatch(last):  # parsed before a stream slot is taken: nothing to give back
            raise HTTPException(400, "Last-Event-ID must be a sequence number (1 to 19 ASCII digits).")
        return self._stream(session, self._events(job.id, int(last), request.cookies.get(COOKIE, "")))

    async def _events(self, job_id: str, cursor: int, session_id: str) -> AsyncIterator[str]:
        """The stream's lines; it ends with the job, or before a batch once the session has ended."""
        yield "retry: 2000\n\n"
        async with contextlib.aclosing(self._series.follow(job_id, cursor)) as batches:  # a gone browser unsubscribes
            async for batch in batches:
                if not await self._still_allowed(session_id):
                    yield "event: signed-out\ndata: {}\n\n"
                    return
                data = json.dumps([u.as_json() for u in batch], allow_nan=False)
                yield f"id: {batch[-1].seq}\nevent: updates\ndata: {data}\n\n"
        yield "event: end\ndata: {}\n\n"

    async def metrics(self, request: Request) -> Response:
        session = await self._session(request)
        job = await self._job(request, session)
        after = request.query_params.get("after", "0")
        if not LAST_EVENT_ID.fullmatch(after):
            raise HTTPException(400, "after must be a cursor (1 to 19 ASCII digits).")
        history = await asyncio.to_thread(self._views.metrics, job.id, int(after))
        return JSONResponse(history | {"state": job.state, "terminal": job.terminal})

    async def logs(self, request: Request) -> Response:
        session = await self._session(request)
        return self._page("logs.html", session=session, job=await self._job(request, session))

    async def log_stream(self, request: Request) -> Response:
        session = await self._session(request)
        job = await self._job(request, session)
        last = request.headers.get("last-event-id")
        if last is not None and not LOG_CURSOR.fullmatch(last):
            raise HTTPException(400, "Last-Event-ID must be the lines read per worker, dot-separated.")
        read = [int(n) for n in last.split(".")] if last is not None else None
        if read is not None and len(read) != job.processes:
            raise HTTPException(400, f"Last-Event-ID must count the lines of {job.processes} worker processes.")
        return self._stream(session, self._log_lines(job, read, request.cookies.get(COOKIE, "")))

    async def _log_lines(self, job: JobRow, read: list[int] | None, session_id: str) -> AsyncIterator[str]:
        """New lines each pass until the job has ended (read before its logs: the last pass has its last
        lines), or until the session has."""
        yield "retry: 2000\n\n"
        while True:
            now = await asyncio.to_thread(self._views.job, job.id, job.tenant)
            counts, lines = await asyncio.to_thread(self._views.log_lines, job, read)
            read = counts
            if not await self._still_allowed(session_id):
                yield "event: signed-out\ndata: {}\n\n"
                return
            if lines:
                data = json.dumps(lines)
                yield f"id: {'.'.join(map(str, counts))}\nevent: lines\ndata: {data}\n\n"
            if now.terminal:
                yield f"event: end\ndata: {json.dumps({'state': now.state})}\n\n"
                return
            await asyncio.sleep(LOG_POLL_SECONDS)

    async def compare(self, request: Request) -> Response:
        session = await self._session(request)
        ids = [i for i in request.query_params.get("jobs", "").split(",") if i]
        try:
            jobs = await asyncio.to_thread(self._views.compared, ids, self._tenant(session))
        except NotFound:
            raise HTTPException(404, "No such job.") from None
        except ValueError as e:
            raise HTTPException(400, str(e)) from None
        return self._page("compare.html", session=session, jobs=jobs)

    async def admin(self, request: Request) -> Response:
        session = await self._session(request)
        if not session.is_admin:
            raise HTTPException(404, "Not found.")
        return self._page("admin.html", session=session, **await asyncio.to_thread(self._views.admin))
