import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AddWebhookRequest(_message.Message):
    __slots__ = ("url", "event_types", "description")
    URL_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPES_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    url: str
    event_types: _containers.RepeatedScalarFieldContainer[str]
    description: str
    def __init__(self, url: _Optional[str] = ..., event_types: _Optional[_Iterable[str]] = ..., description: _Optional[str] = ...) -> None: ...

class WebhookInfo(_message.Message):
    __slots__ = ("id", "url", "event_types", "description", "created")
    ID_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPES_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    id: str
    url: str
    event_types: _containers.RepeatedScalarFieldContainer[str]
    description: str
    created: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., url: _Optional[str] = ..., event_types: _Optional[_Iterable[str]] = ..., description: _Optional[str] = ..., created: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class AddWebhookReply(_message.Message):
    __slots__ = ("webhook", "secret")
    WEBHOOK_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    webhook: WebhookInfo
    secret: str
    def __init__(self, webhook: _Optional[_Union[WebhookInfo, _Mapping]] = ..., secret: _Optional[str] = ...) -> None: ...

class ListWebhooksRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWebhooksReply(_message.Message):
    __slots__ = ("webhooks",)
    WEBHOOKS_FIELD_NUMBER: _ClassVar[int]
    webhooks: _containers.RepeatedCompositeFieldContainer[WebhookInfo]
    def __init__(self, webhooks: _Optional[_Iterable[_Union[WebhookInfo, _Mapping]]] = ...) -> None: ...

class RemoveWebhookRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class RemoveWebhookReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWebhookDeliveriesRequest(_message.Message):
    __slots__ = ("webhook_id", "state", "limit")
    WEBHOOK_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    webhook_id: str
    state: str
    limit: int
    def __init__(self, webhook_id: _Optional[str] = ..., state: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class WebhookDelivery(_message.Message):
    __slots__ = ("id", "webhook_id", "event_id", "event_type", "job_id", "state", "attempts", "last_status", "last_error", "created", "next_attempt")
    ID_FIELD_NUMBER: _ClassVar[int]
    WEBHOOK_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LAST_STATUS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    NEXT_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    id: str
    webhook_id: str
    event_id: str
    event_type: str
    job_id: str
    state: str
    attempts: int
    last_status: int
    last_error: str
    created: _timestamp_pb2.Timestamp
    next_attempt: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., webhook_id: _Optional[str] = ..., event_id: _Optional[str] = ..., event_type: _Optional[str] = ..., job_id: _Optional[str] = ..., state: _Optional[str] = ..., attempts: _Optional[int] = ..., last_status: _Optional[int] = ..., last_error: _Optional[str] = ..., created: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., next_attempt: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListWebhookDeliveriesReply(_message.Message):
    __slots__ = ("deliveries",)
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    deliveries: _containers.RepeatedCompositeFieldContainer[WebhookDelivery]
    def __init__(self, deliveries: _Optional[_Iterable[_Union[WebhookDelivery, _Mapping]]] = ...) -> None: ...
