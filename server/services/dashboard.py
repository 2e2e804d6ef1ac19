"""Dashboard: login links for the web dashboard, asked for over mutual TLS by a tenant or an admin."""

from __future__ import annotations

import datetime as dt

from google.protobuf import timestamp_pb2

from cantata.proto.v1 import dashboard_pb2, dashboard_pb2_grpc
from cantata.security.audit import Action, Outcome
from cantata.security.pki import peer_certificate
from cantata.server.dashboard.signin import LoginsLimited, SignIn
from cantata.server.enrollment import RefusalDigest
from cantata.server.network.ports import AuditSink
from cantata.server.store import Conflict


class DashboardService(dashboard_pb2_grpc.DashboardServicer):
    """Issues login links; a link past the caller's limits is ``RESOURCE_EXHAUSTED`` with when to retry, and such
    refusals are audited counted (one record per burst, per principal and limit), so a flood cannot bloat the log."""

    def __init__(self, signin: SignIn | None, base_url: str, audit: AuditSink, refusals: RefusalDigest):
        self._signin = signin  # None: this server serves no dashboard
        self._base_url = base_url
        self._audit = audit.append
        self._refusals = refusals

    def CreateDashboardLogin(self, request, context):
        if self._signin is None:
            raise Conflict("this server has no dashboard (set dashboard_listen in server.json)")
        peer = peer_certificate(context.auth_context())
        assert peer is not None and peer.principal is not None, "called without authentication"
        who = peer.principal
        try:
            token = self._signin.issue(who, peer.serial)
        except LoginsLimited as limited:
            self._refusals.append(
                who.uri,
                Action.DASHBOARD_LINK_ISSUED,
                tenant=who.name if who.role == "tenant" else "",
                outcome=Outcome.REFUSED,
                details={"reason": limited.what, "limit": limited.limit},
                peer=context.peer(),
                counted=True,
            )
            raise
        expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=self._signin.link_seconds)
        self._audit(
            who.uri,
            Action.DASHBOARD_LINK_ISSUED,
            tenant=who.name if who.role == "tenant" else "",
            details={"expires_in_s": self._signin.link_seconds},
            peer=context.peer(),
        )
        stamp = timestamp_pb2.Timestamp()
        stamp.FromDatetime(expires)
        return dashboard_pb2.DashboardLogin(url=f"{self._base_url}/login/{token}", expires=stamp)
