"""What the client's resources (``client.jobs``, ``client.checkpoints``, ...) share: the client they call through."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from cantata.sdk.errors import InvalidArgument

if TYPE_CHECKING:
    from cantata.sdk.client import Client


class Resource:
    """One group of calls of a :class:`Client`; its connection, timeout and error mapping are the client's."""

    def __init__(self, client: Client):
        self._client = client

    def _call(self, method, request) -> Any:
        return self._client._call(method, request)


def utc(moment: dt.datetime | str) -> dt.datetime:
    """A time as an aware UTC datetime; naive times and ISO 8601 text without a zone are UTC."""
    if isinstance(moment, str):
        try:
            moment = dt.datetime.fromisoformat(moment)
        except ValueError:
            raise InvalidArgument(f"not an ISO 8601 time: {moment!r}") from None
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment.astimezone(dt.UTC)
