"""Webhook URLs: what a tenant may register, and which addresses a delivery may connect to.

Only ``https://`` URLs of at most :data:`MAX_URL_LENGTH` characters, without a
user part or fragment, are accepted. Against server-side request forgery, a
URL's host is resolved when it is registered and again before every delivery,
and every address it resolves to must be public: loopback, private, link-local,
multicast, reserved and unspecified addresses (IPv4-mapped ones included) are
refused unless a network of the server's ``webhook_allowed_networks`` holds
them. A delivery connects to the address it checked, never resolving again,
so a name that changes its answer between check and connect gains nothing.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_URL_LENGTH = 2048

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class InvalidWebhook(ValueError):
    """A webhook's URL or event types are refused; the message says why."""


@dataclass(frozen=True)
class Target:
    """A checked webhook URL: where to connect and what to ask for."""

    url: str
    host: str  # the name TLS verifies and the Host header carries
    port: int
    path: str  # path and query


def parse_url(url: str) -> Target:
    """The target of ``url``, or ``InvalidWebhook`` saying what is wrong with it."""
    if len(url) > MAX_URL_LENGTH:
        raise InvalidWebhook(f"url: longer than {MAX_URL_LENGTH} characters")
    parts = urlsplit(url)
    if parts.scheme != "https":
        raise InvalidWebhook("url: must be https://")
    if not parts.hostname:
        raise InvalidWebhook("url: has no host")
    if parts.username is not None or parts.password is not None:
        raise InvalidWebhook("url: must not carry a user or password")
    if parts.fragment:
        raise InvalidWebhook("url: must not have a fragment")
    try:
        port = parts.port or 443
    except ValueError:
        raise InvalidWebhook("url: the port is not a number from 1 to 65535") from None
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(url, parts.hostname, port, path)


class AddressPolicy:
    """Which resolved addresses a webhook may reach: public ones, and those of ``allowed_networks``."""

    def __init__(self, allowed_networks: Iterable[str] = ()):
        self._allowed = [ipaddress.ip_network(network, strict=False) for network in allowed_networks]

    def allows(self, address: IPAddress) -> bool:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if any(address in network for network in self._allowed):
            return True
        return address.is_global and not address.is_multicast

    def resolve(self, target: Target) -> list[str]:
        """The addresses ``target``'s host resolves to, every one allowed (else ``InvalidWebhook``)."""
        try:
            found = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as error:
            raise InvalidWebhook(f"url: {target.host} does not resolve ({error})") from None
        addresses = list(dict.fromkeys(str(info[4][0]).partition("%")[0] for info in found))
        for address in addresses:
            if not self.allows(ipaddress.ip_address(address)):
                raise InvalidWebhook(
                    f"url: {target.host} resolves to {address}, an address webhooks may not reach "
                    "(loopback, private, link-local or reserved; see webhook_allowed_networks)"
                )
        return addresses
