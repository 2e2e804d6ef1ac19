"""Signing a browser in to the dashboard without a password: one-time login links and server-side sessions.

A caller holding a certificate asks (``Dashboard/CreateDashboardLogin``, over
mutual TLS) for a link; the link's token is bound to that principal, expires
after ``LINK_SECONDS`` and can be redeemed once. Redeeming it opens a session
held in the server's memory (the browser holds only its random id, in an
HttpOnly, Secure, SameSite=Strict cookie) that expires after
``SESSION_SECONDS``. Only SHA-256 digests of tokens and session ids are kept,
so a memory dump does not hand out live sessions. A restart signs everyone out.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from cantata.security.pki import Principal

LINK_SECONDS = 60.0
SESSION_SECONDS = 8 * 3600.0
REMEMBER_SECONDS = 3600.0  # a spent or expired link is remembered this long, so its refusal names it
MAX_LINKS = 10_000  # links remembered at once; past it the oldest are forgotten first


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


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class SignIn:
    """Login links and sessions, in memory; thread-safe (links are made on the gRPC pool, redeemed on the loop)."""

    def __init__(
        self,
        link_seconds: float = LINK_SECONDS,
        session_seconds: float = SESSION_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.link_seconds = link_seconds
        self.session_seconds = session_seconds
        self._clock = clock
        self._links: dict[str, _Link] = {}  # by token digest, oldest first
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def issue(self, principal: Principal, serial: int) -> str:
        """A new single-use token for ``principal`` (whose certificate is ``serial``), valid for ``link_seconds``."""
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._forget_expired()
            while len(self._links) >= MAX_LINKS:
                del self._links[next(iter(self._links))]
            self._links[_digest(token)] = _Link(principal, serial, self._clock() + self.link_seconds)
        return token

    def redeem(self, token: str) -> tuple[str, Session]:
        """Spend ``token``: a new session id and its session; ``LoginRefused`` if it is unknown, expired or used."""
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
            session_id = secrets.token_urlsafe(32)
            session = Session(link.principal, link.serial, now + self.session_seconds)
            self._sessions[_digest(session_id)] = session
            return session_id, session

    def session(self, session_id: str) -> Session | None:
        """The live session behind a cookie's id, or None (unknown or expired)."""
        key = _digest(session_id)
        with self._lock:
            session = self._sessions.get(key)
            if session is None or self._clock() >= session.expires:
                self._sessions.pop(key, None)
                return None
            return session

    def _forget_expired(self) -> None:
        now = self._clock()
        for key in [k for k, link in self._links.items() if now >= link.deadline + REMEMBER_SECONDS]:
            del self._links[key]
        for key in [k for k, s in self._sessions.items() if now >= s.expires]:
            del self._sessions[key]
