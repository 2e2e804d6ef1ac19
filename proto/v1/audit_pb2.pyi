from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

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
