"""Webhooks: a tenant adds, lists and removes its HTTPS endpoints and reads their deliveries.

Only tenants call it (the authorization table says so), each about its own
endpoints: another tenant's id is ``NOT_FOUND`` like a missing one. An added
URL must pass the address policy (:mod:`cantata.server.webhooks.targets`) now,
and again at every delivery. The signing secret is in the reply to
``AddWebhook`` only; the audit log records each add and remove without it.
"""

from __future__ import annotations

import datetime as dt

from cantata.proto.v1 import webhooks_pb2, webhooks_pb2_grpc
from cantata.security.audit import Action
from cantata.server.auth import caller
from cantata.server.webhooks.store import DeliveryRecord, WebhookRecord, WebhookStore
from cantata.server.webhooks.targets import AddressPolicy, parse_url


def _info(record: WebhookRecord) -> webhooks_pb2.WebhookInfo:
    info = webhooks_pb2.WebhookInfo(
        id=record.id, url=record.url, event_types=record.event_types, description=record.description
    )
    info.created.FromJsonString(record.created_at.replace("+00:00", "Z"))
    return info


def _delivery(record: DeliveryRecord) -> webhooks_pb2.WebhookDelivery:
    delivery = webhooks_pb2.WebhookDelivery(
        id=str(record.id),
        webhook_id=record.webhook_id,
        event_id=record.event_id,
        event_type=record.event_type,
        job_id=record.job_id,
        state=record.state,
        attempts=record.attempts,
        last_status=record.last_status,
        last_error=record.last_error,
    )
    delivery.created.FromJsonString(record.created_at.replace("+00:00", "Z"))
    if record.state == "pending":
        delivery.next_attempt.FromDatetime(dt.datetime.fromtimestamp(record.next_attempt_at, dt.UTC))
    return delivery


class WebhooksService(webhooks_pb2_grpc.WebhooksServicer):
    def __init__(self, webhooks: WebhookStore, policy: AddressPolicy, audit):
        self._webhooks = webhooks
        self._policy = policy
        self._audit = audit

    def AddWebhook(self, request, context):
        me = caller(context)
        self._policy.resolve(parse_url(request.url))
        with self._webhooks.database.transaction():  # added only once its record is durable
            record, secret = self._webhooks.add(me.name, request.url, request.event_types, request.description)
            self._audit(
                me.uri,
                Action.WEBHOOK_ADDED,
                resource=record.id,
                tenant=me.name,
                peer=context.peer(),
                details={"url": record.url, "event_types": list(record.event_types)},
            )
        return webhooks_pb2.AddWebhookReply(webhook=_info(record), secret=secret)

    def ListWebhooks(self, request, context):
        return webhooks_pb2.ListWebhooksReply(
            webhooks=[_info(r) for r in self._webhooks.endpoints(caller(context).name)]
        )

    def RemoveWebhook(self, request, context):
        me = caller(context)
        with self._webhooks.database.transaction():  # removed only once its record is durable
            record = self._webhooks.remove(me.name, request.id)
            self._audit(
                me.uri,
                Action.WEBHOOK_REMOVED,
                resource=record.id,
                tenant=me.name,
                peer=context.peer(),
                details={"url": record.url},
            )
        return webhooks_pb2.RemoveWebhookReply()

    def ListWebhookDeliveries(self, request, context):
        records = self._webhooks.deliveries(
            caller(context).name, request.webhook_id, request.state, request.limit or 100
        )
        return webhooks_pb2.ListWebhookDeliveriesReply(deliveries=[_delivery(r) for r in records])
