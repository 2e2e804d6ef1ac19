"""Webhooks: a tenant's HTTPS endpoints for job events, and the check a receiver makes of each delivery.

``client.webhooks`` adds, lists and removes endpoints and reads their
deliveries. A delivery is a POST of a JSON event (``id``, ``type``,
``created``, ``tenant``, ``data``) with the headers ``Cantata-Event-Id``,
``Cantata-Event-Type`` and ``Cantata-Signature: t=UNIX,v1=HEX``, the
HMAC-SHA256 under the endpoint's secret of ``UNIX.BODY``. A receiver calls
:func:`verify_signature` on the raw body before trusting it, and drops an
event id it has seen (a delivery may come twice).
"""

from __future__ import annotations

import builtins
import hashlib
import hmac
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cantata.proto.v1 import webhooks_pb2
from cantata.sdk.resource import Resource

SIGNATURE_HEADER = "Cantata-Signature"
DEFAULT_TOLERANCE_S = 300.0


class InvalidSignature(Exception):
    """A delivery's signature is missing, malformed, too old or not made with the given secret."""


def verify_signature(
    secret: str, headers: Mapping[str, str], body: bytes, tolerance: float = DEFAULT_TOLERANCE_S
) -> None:
    """Raise :class:`InvalidSignature` unless ``body`` was signed with ``secret`` within ``tolerance`` seconds.

    ``headers`` is the request's headers (any case of the names); ``body`` its raw bytes, unparsed.
    """
    value = next((v for k, v in headers.items() if k.lower() == SIGNATURE_HEADER.lower()), None)
    if not value:
        raise InvalidSignature(f"no {SIGNATURE_HEADER} header")
    fields: dict[str, list[str]] = {}
    for part in value.split(","):
        key, _, item = part.strip().partition("=")
        fields.setdefault(key, []).append(item)
    try:
        timestamp = int(fields["t"][0])
    except (KeyError, ValueError):
        raise InvalidSignature(f"{SIGNATURE_HEADER} has no timestamp t=") from None
    if abs(time.time() - timestamp) > tolerance:
        raise InvalidSignature(f"the signature's timestamp is more than {tolerance:g} s from now (a replay?)")
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    if not any(hmac.compare_digest(expected, given) for given in fields.get("v1", [])):
        raise InvalidSignature("the signature does not match this secret and body")


@dataclass(frozen=True)
class Webhook:
    """A registered endpoint; ``secret`` is set only in what :meth:`Webhooks.add` returns."""

    id: str
    url: str
    event_types: tuple[str, ...]  # empty: every type
    description: str
    created: str
    secret: str = ""

    @classmethod
    def from_proto(cls, info: webhooks_pb2.WebhookInfo, secret: str = "") -> Webhook:
        return cls(info.id, info.url, tuple(info.event_types), info.description, info.created.ToJsonString(), secret)


@dataclass(frozen=True)
class WebhookDelivery:
    """One event sent (or being sent) to one endpoint: ``pending``, ``delivered`` or ``dead``."""

    id: str
    webhook_id: str
    event_id: str
    event_type: str
    job_id: str
    state: str
    attempts: int
    last_status: int
    last_error: str
    created: str
    next_attempt: str  # while pending

    @classmethod
    def from_proto(cls, d: webhooks_pb2.WebhookDelivery) -> WebhookDelivery:
        return cls(
            d.id,
            d.webhook_id,
            d.event_id,
            d.event_type,
            d.job_id,
            d.state,
            d.attempts,
            d.last_status,
            d.last_error,
            d.created.ToJsonString(),
            d.next_attempt.ToJsonString() if d.HasField("next_attempt") else "",
        )


class Webhooks(Resource):
    """``client.webhooks``: the tenant's endpoints and their deliveries."""

    def add(self, url: str, event_types: Iterable[str] = (), description: str = "") -> Webhook:
        """Register ``url`` (https) for ``event_types`` (default: all); the result holds the signing secret,
        which no later call shows again."""
        request = webhooks_pb2.AddWebhookRequest(url=url, event_types=list(event_types), description=description)
        reply = self._call(self._client._webhooks.AddWebhook, request)
        return Webhook.from_proto(reply.webhook, reply.secret)

    def list(self) -> builtins.list[Webhook]:
        reply = self._call(self._client._webhooks.ListWebhooks, webhooks_pb2.ListWebhooksRequest())
        return [Webhook.from_proto(w) for w in reply.webhooks]

    def remove(self, webhook_id: str) -> None:
        """Remove the endpoint; its pending deliveries are dropped."""
        self._call(self._client._webhooks.RemoveWebhook, webhooks_pb2.RemoveWebhookRequest(id=webhook_id))

    def deliveries(self, webhook_id: str = "", *, state: str = "", limit: int = 100) -> builtins.list[WebhookDelivery]:
        """The newest deliveries (of one endpoint; in one state: pending, delivered or dead)."""
        request = webhooks_pb2.ListWebhookDeliveriesRequest(webhook_id=webhook_id, state=state, limit=limit)
        reply = self._call(self._client._webhooks.ListWebhookDeliveries, request)
        return [WebhookDelivery.from_proto(d) for d in reply.deliveries]
