"""Signing a browser in to the dashboard without a password: one-time login links and server-side sessions.

A caller holding a certificate asks (``Dashboard/CreateDashboardLogin``, over
mutual TLS) for a link; the link's token is bound to that principal, expires
after ``LINK_SECONDS`` and can be redeemed once. Redeeming it opens a session
held in the server's memory (the browser holds only its random id, in an
HttpOnly, Secure, SameSite=Strict cookie) that expires after
``SESSION_SECONDS``. Only SHA-256 digests of tokens and session ids are kept,
so a memory dump does not hand out live sessions. A restart signs everyone out,
and so does suspending a tenant (:meth:`SignIn.sign_out`).

Each principal has its own bounds (:class:`SignInLimits`): open links, links
per minute, live sessions. Nothing is bounded globally, so that one
principal's flood can never push out another's link or session; memory is
bounded by the principals (certificate holders) times their limits.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cantata.security.pki import Principal

LINK_SECONDS = 60.0
SESSION_SECONDS = 8 * 3600.0
REMEMBER_SECONDS = 3600.0  # a spent or expired link is remembered this long, so its refusal names it


@dataclass(frozen=True)
class SignInLimits:
    """What one principal may hold and ask for (``dashboard_*`` in ``server.json``); no principal's use of them
    touches another's links or sessions."""

    links_per_principal: int = 10  # unused, unexpired login links held at once
    links_per_minute: float = 6.0  # links issued, refilled continuously ...
    link_burst: int = 10  # ... of which this many may come at once
    sessions_per_principal: int = 16  # live sessions; a new one ends that principal's oldest

    def __post_init__(self) -> None:
        if (
            min(self.links_per_principal, self.link_burst, self.sessions_per_principal) < 1
            or self.links_per_minute <= 0
        ):
            raise ValueError("dashboard link and session limits must be positive")


class LoginsLimited(Exception):
    """A principal asked for a login link past one of its limits: ``what`` names it, ``retry_after_s`` says when
    one is free again."""

    def __init__(self, what: str, limit: float, used: int, retry_after_s: float):
        super().__init__(f"quota exceeded: {what} (limit {limit:g}); retry in {max(retry_after_s, 1.0):.0f} s")
        self.what, self.limit, self.used, self.retry_after_s = what, limit, used, retry_after_s


class LoginRefused(Exception):
    """A login link that is unknown, expired or already used (which of these is not told to the browser)."""

    def __init__(self, reason: str, principal: Principal | None = None):
        super().__init__(reason)
        self.reason = reason
        self.principal = principal


@dataclass
class _Link:
    principal: Principal
    serial: int
    deadline: float
    used: bool = False


@dataclass(frozen=True)
class Session:
    principal: Principal
    serial: int  # of the certificate that asked for the link: revoking it ends the session
    expires: float  # time.monotonic() deadline

    @property
    def is_admin(self) -> bool:
        return self.principal.role == "admin"


@dataclass
class _Held:
    """One principal's links and sessions (digests, oldest first) and its link bucket."""

    tokens: float
    at: float
    links: dict[str, None] = field(default_factory=dict)
    sessions: dict[str, None] = field(default_factory=dict)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class SignIn:
    """Login links and sessions, in memory; thread-safe (links are made on the gRPC pool, redeemed on the loop)."""

    def __init__(
        self,
        link_seconds: float = LINK_SECONDS,
        session_seconds: float = SESSION_SECONDS,
        limits: SignInLimits = SignInLimits(),
        clock: Callable[[], float] = time.monotonic,
    ):
        self.link_seconds = link_seconds
        self.session_seconds = session_seconds
        self.limits = limits
        self._clock = clock
        self._links: dict[str, _Link] = {}  # by token digest
        self._sessions: dict[str, Session] = {}  # by session id digest
        self._held: dict[str, _Held] = {}  # by principal URI
        self._lock = threading.Lock()

    def issue(self, principal: Principal, serial: int) -> str:
        """A new single-use token for ``principal`` (whose certificate is ``serial``), valid for ``link_seconds``;
        :class:`LoginsLimited` past the principal's limits."""
        token = secrets.token_urlsafe(32)
        limits = self.limits
        with self._lock:
            now = self._clock()
            self._forget_expired(now)
            held = self._held_by(principal.uri, now)
            rate = limits.links_per_minute / 60.0
            held.tokens, held.at = min(float(limits.link_burst), held.tokens + (now - held.at) * rate), now
            open_links = [self._links[key] for key in held.links if self._is_open(self._links[key], now)]
            if len(open_links) >= limits.links_per_principal:
                wait = min(link.deadline for link in open_links) - now
                raise LoginsLimited("open login links", limits.links_per_principal, len(open_links), wait)
            if held.tokens < 1.0:
                wait = (1.0 - held.tokens) / rate
                raise LoginsLimited("login links per minute", limits.links_per_minute, limits.link_burst, wait)
            held.tokens -= 1.0
            key = _digest(token)
            self._links[key] = _Link(principal, serial, now + self.link_seconds)
            held.links[key] = None
        return token

    def redeem(self, token: str) -> tuple[str, Session]:
        """Spend ``token``: a new session id and its session; ``LoginRefused`` if it is unknown, expired or used.

        A principal holding ``sessions_per_principal`` sessions loses its oldest one to the new one."""
        key = _digest(token)
        with self._lock:
            now = self._clock()
            link = self._links.get(key)
            if link is None:
                raise LoginRefused("unknown")
            if link.used:
                raise LoginRefused("used", link.principal)
            if now >= link.deadline:
                raise LoginRefused("expired", link.principal)
            link.used = True
            held = self._held_by(link.principal.uri, now)
            while len(held.sessions) >= self.limits.sessions_per_principal:
                oldest = next(iter(held.sessions))
                del held.sessions[oldest]
                self._sessions.pop(oldest, None)
            session_id = secrets.token_urlsafe(32)
            session = Session(link.principal, link.serial, now + self.session_seconds)
            self._sessions[_digest(session_id)] = session
            held.sessions[_digest(session_id)] = None
            return session_id, session

    def session(self, session_id: str) -> Session | None:
        """The live session behind a cookie's id, or None (unknown or expired)."""
        key = _digest(session_id)
        with self._lock:
            session = self._sessions.get(key)
            if session is None:
                return None
            if self._clock() >= session.expires:
                self._end_session(key, session)
                return None
            return session

    def sign_out(self, principal: Principal) -> int:
        """End every session of ``principal`` and void its links (a suspended tenant); returns how many ended."""
        with self._lock:
            held = self._held.pop(principal.uri, None)
            if held is None:
                return 0
            for key in held.links:
                self._links.pop(key, None)
            for key in held.sessions:
                self._sessions.pop(key, None)
            return len(held.sessions)

    def held(self, principal: Principal) -> tuple[int, int]:
        """How many (open links, live sessions) ``principal`` holds."""
        with self._lock:
            now = self._clock()
            held = self._held.get(principal.uri)
            if held is None:
                return 0, 0
            links = sum(1 for key in held.links if self._is_open(self._links[key], now))
            return links, sum(1 for key in held.sessions if now < self._sessions[key].expires)

    @staticmethod
    def _is_open(link: _Link, now: float) -> bool:
        return not link.used and now < link.deadline

    def _held_by(self, uri: str, now: float) -> _Held:
        held = self._held.get(uri)
        if held is None:
            held = self._held[uri] = _Held(tokens=float(self.limits.link_burst), at=now)
        return held

    def _end_session(self, key: str, session: Session) -> None:
        del self._sessions[key]
        held = self._held.get(session.principal.uri)
        if held is not None:
            held.sessions.pop(key, None)

    def _forget_expired(self, now: float) -> None:
        """Forget links long past their end and expired sessions, and principals left with neither (lock held)."""
        for uri, held in list(self._held.items()):
            for key in [k for k in held.links if now >= self._links[k].deadline + REMEMBER_SECONDS]:
                del held.links[key]
                del self._links[key]
            for key in [k for k in held.sessions if now >= self._sessions[k].expires]:
                del held.sessions[key]
                del self._sessions[key]
            full = held.tokens + (now - held.at) * self.limits.links_per_minute / 60.0 >= self.limits.link_burst
            if not held.links and not held.sessions and full:
                del self._held[uri]
