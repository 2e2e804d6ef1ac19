import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateDashboardLoginRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DashboardLogin(_message.Message):
    __slots__ = ("url", "expires")
    URL_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_FIELD_NUMBER: _ClassVar[int]
    url: str
    expires: _timestamp_pb2.Timestamp
    def __init__(self, url: _Optional[str] = ..., expires: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
