"""Screening of record details: plain JSON values only, and never secret material."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping

from .errors import SecretMaterialError

_SECRET_WORDS = frozenset(
    {
        "key",
        "keys",
        "secret",
        "secrets",
        "password",
        "passwd",
        "passphrase",
        "pwd",
        "token",
        "tokens",
        "private",
        "credential",
        "credentials",
        "pem",
        "cookie",
        "authorization",
    }
)
# A name ending in one of these words names or counts a secret without holding it (``key_id``).
_REFERENCE_WORDS = frozenset({"id", "ids", "fingerprint", "fingerprints", "name", "names", "count", "version"})
_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
_PEM_PRIVATE = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")
MAX_DEPTH = 8


def _words(name: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(name)]


@functools.lru_cache(maxsize=4096)  # the same few field names come back in every record
def _is_secret_name(name: str) -> bool:
    words = _words(name)
    if not words or words[-1] in _REFERENCE_WORDS:
        return False
    return any(w in _SECRET_WORDS for w in words)


def screen_details(details: Mapping[str, object] | None) -> dict[str, object]:
    """Return a plain-JSON copy of ``details``.

    Raises :class:`SecretMaterialError` (a ``ValueError``) when a field is named
    like secret material (``key``, ``client_secret``, ``apiToken``...; names
    ending in ``_id``/``_fingerprint`` are references and allowed) or a string
    holds a PEM private key, and ``ValueError`` when a value is not plain JSON
    (str, int, finite float, bool, None, list, str-keyed dict).
    """
    if details is None:
        return {}
    if not isinstance(details, Mapping):
        raise ValueError(f"details must be a mapping, not {type(details).__name__}")
    return _screen_mapping(details, "details", 0)


def _screen_mapping(mapping: Mapping, path: str, depth: int) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, value in mapping.items():
        if not isinstance(name, str):
            raise ValueError(f"{path}: field names must be strings, got {name!r}")
        if _is_secret_name(name):
            raise SecretMaterialError(
                f"{path}.{name}: field looks like secret material; audit records never hold secrets"
            )
        out[name] = _screen_value(value, f"{path}.{name}", depth + 1)
    return out


def _screen_value(value: object, path: str, depth: int) -> object:
    if depth > MAX_DEPTH:
        raise ValueError(f"{path}: nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{path}: {value} is not a finite number")
        return value
    if isinstance(value, str):
        if _PEM_PRIVATE.search(value):
            raise SecretMaterialError(f"{path}: value holds a PEM private key; audit records never hold secrets")
        return value
    if isinstance(value, Mapping):
        return _screen_mapping(value, path, depth)
    if isinstance(value, (list, tuple)):
        return [_screen_value(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
    if isinstance(value, (bytes, bytearray, memoryview)):
        raise SecretMaterialError(f"{path}: raw bytes are not recorded (they may be key material)")
    raise ValueError(f"{path}: {type(value).__name__} is not a plain JSON value")
