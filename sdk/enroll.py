"""Tenant enrollment from the client side: key, CSR, and fetching the certificate.

The key never leaves this machine. Polling the status proves possession of
that key by signing ``cantata-tenancy-status\\n<name>\\n<unix time>``.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from cantata.proto.v1 import tenancy_pb2, tenancy_pb2_grpc
from cantata.sdk.errors import from_rpc_error
from cantata.sdk.profiles import Profile, enrollment_address

TIMEOUT = 30.0


@dataclass(frozen=True)
class EnrollmentStatus:
    name: str
    status: str
    fingerprint: str = ""
    certificate_installed: bool = False


def status_message(name: str, unix_time: int) -> bytes:
    return f"cantata-tenancy-status\n{name}\n{unix_time}".encode()


def _key_and_csr(name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.CertificateSigningRequest]:
    """A fresh P-256 key and a CSR for it (the CA ignores the CSR's names and sets its own)."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .sign(key, hashes.SHA256())
    )
    return key, csr


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _stub(address: str, ca_pem: bytes) -> tuple[grpc.Channel, tenancy_pb2_grpc.TenancyStub]:
    channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=ca_pem))
    return channel, tenancy_pb2_grpc.TenancyStub(channel)


def request_tenancy(name: str, server: str, ca_pem: bytes, enroll_server: str = "") -> EnrollmentStatus:
    """Create profile ``name`` with a fresh key and send its CSR; returns the CSR fingerprint.

    ``server`` is the control plane's address; enrollment goes to ``enroll_server``
    (by default the same host, port + 1), which needs no client certificate.
    """
    enroll_server = enroll_server or enrollment_address(server)
    profile = Profile.named(name)
    if profile.key.exists():
        raise FileExistsError(f"profile {name!r} already has a key at {profile.key}")
    key, csr = _key_and_csr(name)
    csr_pem = csr.public_bytes(serialization.Encoding.PEM)
    channel, stub = _stub(enroll_server, ca_pem)
    try:
        reply = stub.RequestTenancy(tenancy_pb2.RequestTenancyRequest(name=name, csr_pem=csr_pem), timeout=TIMEOUT)
    except grpc.RpcError as err:
        raise from_rpc_error(err) from None
    finally:
        channel.close()
    profile.create(server, enroll_server, ca_pem)
    profile.write_key(_key_pem(key))
    local = "sha256:" + hashlib.sha256(csr.public_bytes(serialization.Encoding.DER)).hexdigest()
    if reply.csr_fingerprint != local:
        raise RuntimeError("the server reported a different CSR fingerprint: refusing to continue")
    return EnrollmentStatus(name, reply.status, reply.csr_fingerprint)


def fetch_status(name: str) -> EnrollmentStatus:
    """Ask for the request's status; once approved, install the certificate in the profile."""
    profile = Profile.named(name)
    key = serialization.load_pem_private_key(profile.key.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{profile.key} is not the ECDSA key `cantata tenant request` made")
    now = int(time.time())
    signature = key.sign(status_message(name, now), ec.ECDSA(hashes.SHA256()))
    channel, stub = _stub(profile.enroll_server, profile.ca.read_bytes())
    try:
        reply = stub.GetTenancyStatus(
            tenancy_pb2.GetTenancyStatusRequest(name=name, unix_time=now, signature=signature), timeout=TIMEOUT
        )
    except grpc.RpcError as err:
        raise from_rpc_error(err) from None
    finally:
        channel.close()
    installed = False
    if reply.certificate_pem:
        profile.cert.write_bytes(reply.certificate_pem)
        installed = True
    return EnrollmentStatus(name, reply.status, certificate_installed=installed)


def renew_certificate(name: str) -> str:
    """Replace profile ``name``'s key and certificate, authenticated by the current ones.

    Returns the new certificate's expiry. The old key is kept until the new
    certificate is safely written.
    """
    profile = Profile.named(name)
    key, csr = _key_and_csr(name)
    credentials = grpc.ssl_channel_credentials(
        profile.ca.read_bytes(), profile.key.read_bytes(), profile.cert.read_bytes()
    )
    channel = grpc.secure_channel(profile.server, credentials)
    try:
        reply = tenancy_pb2_grpc.TenancyStub(channel).RenewCertificate(
            tenancy_pb2.RenewCertificateRequest(csr_pem=csr.public_bytes(serialization.Encoding.PEM)), timeout=TIMEOUT
        )
    except grpc.RpcError as err:
        raise from_rpc_error(err) from None
    finally:
        channel.close()
    cert = x509.load_pem_x509_certificate(reply.certificate_pem)
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if cert.public_key().public_bytes(*spki) != key.public_key().public_bytes(*spki):
        raise RuntimeError("the server returned a certificate for another key: refusing it")
    profile.write_key(_key_pem(key))
    profile.cert.write_bytes(reply.certificate_pem)
    return cert.not_valid_after_utc.isoformat()


def add_scraper(admin_profile: str, name: str) -> tuple[Profile, str]:
    """Make a key and CSR here, have the admin sign it as scraper ``name``, and write profile ``name``.

    The profile holds the scraper's certificate and key (a Prometheus ``tls_config``'s ``cert_file`` and
    ``key_file``), the CA, and ``metrics_server`` (where ``/metrics`` is served; empty when the server
    serves none). Returns the profile and the certificate's hex serial (for ``revoke-cert``).
    """
    from cantata.sdk.client import Client

    admin = Profile.named(admin_profile)
    key, csr = _key_and_csr(name)
    with Client.from_profile(admin_profile) as client:
        reply = client.add_scraper(name, csr.public_bytes(serialization.Encoding.PEM))
    cert = x509.load_pem_x509_certificate(reply.cert_pem)
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if cert.public_key().public_bytes(*spki) != key.public_key().public_bytes(*spki):
        raise RuntimeError("the server returned a certificate for another key: refusing it")
    profile = Profile.named(name)
    profile.create(admin.server, admin.enroll_server, admin.ca.read_bytes(), metrics_server=reply.metrics_address)
    profile.write_key(_key_pem(key))
    profile.cert.write_bytes(reply.cert_pem)
    return profile, reply.serial
