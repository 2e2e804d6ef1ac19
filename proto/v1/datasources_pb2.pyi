import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DataSourceKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DATA_SOURCE_KIND_UNSPECIFIED: _ClassVar[DataSourceKind]
    S3: _ClassVar[DataSourceKind]
    AZURE_BLOB: _ClassVar[DataSourceKind]
DATA_SOURCE_KIND_UNSPECIFIED: DataSourceKind
S3: DataSourceKind
AZURE_BLOB: DataSourceKind

class S3Credentials(_message.Message):
    __slots__ = ("access_key_id", "secret_access_key", "session_token", "region")
    ACCESS_KEY_ID_FIELD_NUMBER: _ClassVar[int]
    SECRET_ACCESS_KEY_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    access_key_id: str
    secret_access_key: str
    session_token: str
    region: str
    def __init__(self, access_key_id: _Optional[str] = ..., secret_access_key: _Optional[str] = ..., session_token: _Optional[str] = ..., region: _Optional[str] = ...) -> None: ...

class AzureCredentials(_message.Message):
    __slots__ = ("connection_string", "account_name", "account_key", "sas_token")
    CONNECTION_STRING_FIELD_NUMBER: _ClassVar[int]
    ACCOUNT_NAME_FIELD_NUMBER: _ClassVar[int]
    ACCOUNT_KEY_FIELD_NUMBER: _ClassVar[int]
    SAS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    connection_string: str
    account_name: str
    account_key: str
    sas_token: str
    def __init__(self, connection_string: _Optional[str] = ..., account_name: _Optional[str] = ..., account_key: _Optional[str] = ..., sas_token: _Optional[str] = ...) -> None: ...

class RegisterDataSourceRequest(_message.Message):
    __slots__ = ("name", "kind", "endpoint", "s3", "azure", "dataset_key", "replace")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    S3_FIELD_NUMBER: _ClassVar[int]
    AZURE_FIELD_NUMBER: _ClassVar[int]
    DATASET_KEY_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: DataSourceKind
    endpoint: str
    s3: S3Credentials
    azure: AzureCredentials
    dataset_key: bytes
    replace: bool
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[DataSourceKind, str]] = ..., endpoint: _Optional[str] = ..., s3: _Optional[_Union[S3Credentials, _Mapping]] = ..., azure: _Optional[_Union[AzureCredentials, _Mapping]] = ..., dataset_key: _Optional[bytes] = ..., replace: _Optional[bool] = ...) -> None: ...

class DataSourceInfo(_message.Message):
    __slots__ = ("name", "kind", "endpoint", "has_dataset_key", "created")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    HAS_DATASET_KEY_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: DataSourceKind
    endpoint: str
    has_dataset_key: bool
    created: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[DataSourceKind, str]] = ..., endpoint: _Optional[str] = ..., has_dataset_key: _Optional[bool] = ..., created: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListDataSourcesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListDataSourcesReply(_message.Message):
    __slots__ = ("sources",)
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    sources: _containers.RepeatedCompositeFieldContainer[DataSourceInfo]
    def __init__(self, sources: _Optional[_Iterable[_Union[DataSourceInfo, _Mapping]]] = ...) -> None: ...

class DeleteDataSourceRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteDataSourceReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
