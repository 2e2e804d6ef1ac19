"""The platform's public-key infrastructure.

One ECDSA P-256 certificate authority signs every certificate on the platform.
A certificate's URI SAN names its principal (``spiffe://cantata/<role>/...``);
that SAN, read from the TLS-verified peer certificate, is the only source of
identity anywhere in Cantata.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import ipaddress
import re
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SPIFFE_PREFIX = "spiffe://cantata/"
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")  # always fullmatch: `$` would let a trailing newline in
_WORKER_URI = re.compile(r"job/([A-Za-z0-9-]{1,64})/worker/(0|[1-9][0-9]{0,5})")


class InvalidName(ValueError):
    """A tenant or admin name that is not a DNS-label-like identifier."""


class InvalidCSR(ValueError):
    """A certificate signing request that cannot be parsed or is not self-consistent."""


def validate_name(name: str) -> str:
    """Return ``name`` if it is a safe principal name (lowercase, digits, '-'), else raise."""
    if not isinstance(name, str) or NAME_PATTERN.fullmatch(name) is None:
        raise InvalidName(f"invalid name {name!r}: use 1-63 lowercase letters, digits or '-'")
    return name


@dataclass(frozen=True)
class Principal:
    """Who a certificate speaks for: an admin, a tenant, one worker of one job, or a metrics scraper."""

    role: str
    name: str
    index: int | None = None  # the worker's index within its job

    @classmethod
    def admin(cls, name: str) -> Principal:
        return cls("admin", validate_name(name))

    @classmethod
    def tenant(cls, name: str) -> Principal:
        return cls("tenant", validate_name(name))

    @classmethod
    def scraper(cls, name: str) -> Principal:
        """A Prometheus scraper the admin issued a certificate to: it may read ``/metrics`` and nothing else."""
        return cls("scraper", validate_name(name))

    @classmethod
    def worker(cls, job_id: str, n: int) -> Principal:
        return cls("worker", job_id, int(n))

    @property
    def uri(self) -> str:
        if self.role == "worker":
            return f"{SPIFFE_PREFIX}job/{self.name}/worker/{self.index}"
        return f"{SPIFFE_PREFIX}{self.role}/{self.name}"

    @property
    def job_id(self) -> str | None:
        return self.name if self.role == "worker" else None

    @classmethod
    def parse(cls, uri: str) -> Principal:
        """Parse a SPIFFE URI SAN; raise ``ValueError`` for anything not ours."""
        if not uri.startswith(SPIFFE_PREFIX):
            raise ValueError(f"not a Cantata identity: {uri!r}")
        path = uri[len(SPIFFE_PREFIX) :]
        match = _WORKER_URI.fullmatch(path)
        if match:
            return cls("worker", match.group(1), int(match.group(2)))
        role, _, name = path.partition("/")
        if role in ("admin", "tenant", "scraper") and NAME_PATTERN.fullmatch(name):
            return cls(role, name)
        raise ValueError(f"not a Cantata identity: {uri!r}")

    def __str__(self) -> str:
        return self.uri


@dataclass(frozen=True)
class Bundle:
    """A certificate, its private key and the CA certificate, all PEM."""

    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_to_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def load_key(pem: bytes) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError("expected an EC private key")
    return key


def make_csr(key: ec.EllipticCurvePrivateKey, name: str) -> bytes:
    """A PEM CSR for tenant ``name``; the CA ignores its SANs and sets its own."""
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, validate_name(name))]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM)


def load_csr(pem: bytes) -> x509.CertificateSigningRequest:
    """Parse a PEM CSR and check its self-signature."""
    try:
        csr = x509.load_pem_x509_csr(pem)
    except ValueError as exc:
        raise InvalidCSR(f"malformed CSR: {exc}") from None
    if not csr.is_signature_valid:
        raise InvalidCSR("CSR signature does not verify")
    if not isinstance(csr.public_key(), ec.EllipticCurvePublicKey):
        raise InvalidCSR("CSR key must be ECDSA")
    return csr


def csr_public_key(pem: bytes) -> ec.EllipticCurvePublicKey:
    """The ECDSA public key of a PEM CSR whose self-signature verifies (``InvalidCSR`` otherwise)."""
    key = load_csr(pem).public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey):  # load_csr refuses other keys; this narrows the type
        raise InvalidCSR("CSR key must be ECDSA")
    return key


def csr_fingerprint(pem: bytes) -> str:
    """``sha256:<hex>`` over the CSR's DER encoding, as shown to admins."""
    der = load_csr(pem).public_bytes(serialization.Encoding.DER)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def gossip_server_name(job_id: str, worker: int) -> str:
    """The DNS SAN of worker ``worker`` of ``job_id``: gossip peers dial it by this name,
    so parameters only ever go to that worker of that job."""
    return f"worker-{worker}.{job_id.lower()}.gossip.cantata"


def tenancy_status_message(name: str, unix_time: int) -> bytes:
    """What a tenant signs with its CSR key to prove possession when polling status."""
    return f"cantata-tenancy-status\n{name}\n{unix_time}".encode()


def sign_message(key: ec.EllipticCurvePrivateKey, message: bytes) -> bytes:
    return key.sign(message, ec.ECDSA(hashes.SHA256()))


def verify_message(public_key: ec.EllipticCurvePublicKey, signature: bytes, message: bytes) -> bool:
    try:
        public_key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
        return True
    except InvalidSignature:
        return False


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class CertificateAuthority:
    """The platform CA: signs server, admin, tenant and worker certificates."""

    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey):
        self.cert = cert
        self.key = key

    @classmethod
    def create(cls, common_name: str = "Cantata Platform CA", years: int = 10) -> CertificateAuthority:
        key = new_key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=365 * years))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    @classmethod
    def load(cls, cert_pem: bytes, key_pem: bytes) -> CertificateAuthority:
        return cls(x509.load_pem_x509_certificate(cert_pem), load_key(key_pem))

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return key_to_pem(self.key)

    def sign(
        self,
        public_key: ec.EllipticCurvePublicKey,
        principal: Principal | None,
        *,
        lifetime: dt.timedelta,
        dns_names: tuple[str, ...] | list[str] = (),
        ips: tuple[str, ...] | list[str] = (),
        server: bool = False,
    ) -> x509.Certificate:
        """Sign a leaf certificate. Its only URI SAN is ``principal.uri``."""
        now = _now()
        not_after = min(now + lifetime, self.cert.not_valid_after_utc)
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        if principal is not None:
            sans.append(x509.UniformResourceIdentifier(principal.uri))
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        common_name = principal.uri if principal else (dns_names[0] if dns_names else "cantata")
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])]))
            .issuer_name(self.cert.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(self.key, hashes.SHA256())

    def issue_bundle(
        self,
        principal: Principal | None,
        *,
        lifetime: dt.timedelta,
        dns_names: tuple[str, ...] | list[str] = (),
        ips: tuple[str, ...] | list[str] = (),
        server: bool = False,
    ) -> Bundle:
        """Make a fresh key and a certificate for it."""
        key = new_key()
        cert = self.sign(key.public_key(), principal, lifetime=lifetime, dns_names=dns_names, ips=ips, server=server)
        return Bundle(cert.public_bytes(serialization.Encoding.PEM), key_to_pem(key), self.cert_pem)


def certificate_principal(cert: x509.Certificate) -> Principal | None:
    """The principal named by a certificate's URI SAN, or None."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    for uri in sans.get_values_for_type(x509.UniformResourceIdentifier):
        try:
            return Principal.parse(uri)
        except ValueError:
            continue
    return None


@dataclass(frozen=True)
class PeerCertificate:
    """The verified peer certificate of a TLS connection, as gRPC reports it."""

    principal: Principal | None
    serial: int
    not_after: dt.datetime


def peer_certificate(auth_context: dict) -> PeerCertificate | None:
    """Read the verified client certificate from ``context.auth_context()``.

    gRPC only fills ``x509_pem_cert`` when the peer presented a certificate that
    chained to our CA; anything the client sends in metadata is ignored.
    """
    pems = auth_context.get("x509_pem_cert") or []
    if not pems:
        return None
    return _parsed_peer(pems[0])


@functools.lru_cache(maxsize=1024)  # each call's peer is read several times, and callers come back
def _parsed_peer(pem: bytes) -> PeerCertificate:
    cert = x509.load_pem_x509_certificate(pem)
    return PeerCertificate(certificate_principal(cert), cert.serial_number, cert.not_valid_after_utc)


def principal_from_auth_context(auth_context: dict) -> Principal | None:
    """The verified peer's principal, or None for a peer without a certificate."""
    peer = peer_certificate(auth_context)
    return peer.principal if peer else None
