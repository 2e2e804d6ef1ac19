"""``client.dashboard``: one-time login links to the web dashboard."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from cantata.proto.v1 import dashboard_pb2
from cantata.sdk.resource import Resource


@dataclass(frozen=True)
class DashboardLogin:
    """A login link for the web dashboard: usable once, until ``expires``."""

    url: str
    expires: dt.datetime


class Dashboard(Resource):
    """``client.dashboard``."""

    def login(self) -> DashboardLogin:
        """A one-time link that signs a browser in to the web dashboard as this client's principal."""
        reply = self._call(self._client._dashboard.CreateDashboardLogin, dashboard_pb2.CreateDashboardLoginRequest())
        return DashboardLogin(reply.url, reply.expires.ToDatetime(tzinfo=dt.UTC))
