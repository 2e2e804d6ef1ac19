from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class RequestTenancyRequest(_message.Message):
    __slots__ = ("name", "csr_pem")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    name: str
    csr_pem: bytes
    def __init__(self, name: _Optional[str] = ..., csr_pem: _Optional[bytes] = ...) -> None: ...

class RequestTenancyReply(_message.Message):
    __slots__ = ("name", "csr_fingerprint", "status")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CSR_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    name: str
    csr_fingerprint: str
    status: str
    def __init__(self, name: _Optional[str] = ..., csr_fingerprint: _Optional[str] = ..., status: _Optional[str] = ...) -> None: ...

class GetTenancyStatusRequest(_message.Message):
    __slots__ = ("name", "unix_time", "signature")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UNIX_TIME_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    name: str
    unix_time: int
    signature: bytes
    def __init__(self, name: _Optional[str] = ..., unix_time: _Optional[int] = ..., signature: _Optional[bytes] = ...) -> None: ...

class GetTenancyStatusReply(_message.Message):
    __slots__ = ("name", "status", "certificate_pem", "ca_pem")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    CA_PEM_FIELD_NUMBER: _ClassVar[int]
    name: str
    status: str
    certificate_pem: bytes
    ca_pem: bytes
    def __init__(self, name: _Optional[str] = ..., status: _Optional[str] = ..., certificate_pem: _Optional[bytes] = ..., ca_pem: _Optional[bytes] = ...) -> None: ...

class RenewCertificateRequest(_message.Message):
    __slots__ = ("csr_pem",)
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    csr_pem: bytes
    def __init__(self, csr_pem: _Optional[bytes] = ...) -> None: ...

class RenewCertificateReply(_message.Message):
    __slots__ = ("certificate_pem",)
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    certificate_pem: bytes
    def __init__(self, certificate_pem: _Optional[bytes] = ...) -> None: ...
