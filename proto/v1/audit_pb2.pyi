from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetReportRequest(_message.Message):
    __slots__ = ("tenant", "since", "until", "format")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    since: str
    until: str
    format: str
    def __init__(self, tenant: _Optional[str] = ..., since: _Optional[str] = ..., until: _Optional[str] = ..., format: _Optional[str] = ...) -> None: ...

class GetReportReply(_message.Message):
    __slots__ = ("intact", "verdict", "content")
    INTACT_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    intact: bool
    verdict: str
    content: str
    def __init__(self, intact: _Optional[bool] = ..., verdict: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class ListEventsRequest(_message.Message):
    __slots__ = ("tenant", "action", "since", "until", "request_id", "page_size", "page_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    action: str
    since: str
    until: str
    request_id: str
    page_size: int
    page_token: str
    def __init__(self, tenant: _Optional[str] = ..., action: _Optional[str] = ..., since: _Optional[str] = ..., until: _Optional[str] = ..., request_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class AuditEvent(_message.Message):
    __slots__ = ("seq", "time", "actor", "action", "resource", "tenant", "outcome", "peer", "request_id", "details_json")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DETAILS_JSON_FIELD_NUMBER: _ClassVar[int]
    seq: int
    time: str
    actor: str
    action: str
    resource: str
    tenant: str
    outcome: str
    peer: str
    request_id: str
    details_json: str
    def __init__(self, seq: _Optional[int] = ..., time: _Optional[str] = ..., actor: _Optional[str] = ..., action: _Optional[str] = ..., resource: _Optional[str] = ..., tenant: _Optional[str] = ..., outcome: _Optional[str] = ..., peer: _Optional[str] = ..., request_id: _Optional[str] = ..., details_json: _Optional[str] = ...) -> None: ...

class ListEventsReply(_message.Message):
    __slots__ = ("events", "next_page_token")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[AuditEvent]
    next_page_token: str
    def __init__(self, events: _Optional[_Iterable[_Union[AuditEvent, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
