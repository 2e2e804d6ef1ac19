"""The tenant's dataset-key file, ``dataset-key.json`` (mode 0600) in its profile.

The document is ``{"tenant": ..., "key": base64(32 bytes)}``. The CLI reads
it to register a data source with the key, ``cantata data upload --encrypt``
seals shards with it (:class:`cantata.trainer.data.DatasetKey`), and a worker
gets the same document in its private config. It lives in the root package
so that the SDK reads it without importing the trainer.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from pathlib import Path
from typing import Any

KEY_FILE = "dataset-key.json"
KEY_SIZE = 32


def check_size(secret: bytes) -> None:
    """Raise ``ValueError`` unless ``secret`` is a whole dataset key."""
    if len(secret) != KEY_SIZE:
        raise ValueError(f"a dataset key has {KEY_SIZE} bytes, not {len(secret)}")


def dumps(tenant: str, secret: bytes) -> str:
    """The document for ``tenant``'s key ``secret``."""
    return json.dumps(to_document(tenant, secret))


def to_document(tenant: str, secret: bytes) -> dict[str, str]:
    """The document for ``tenant``'s key ``secret``, as a JSON object."""
    return {"tenant": tenant, "key": base64.b64encode(secret).decode()}


def from_document(document: Any) -> tuple[str, bytes]:
    """The tenant and secret of a parsed document; ``ValueError`` if it is not a valid one."""
    try:
        tenant, secret = str(document["tenant"]), base64.b64decode(document["key"], validate=True)
        check_size(secret)
    except (ValueError, KeyError, TypeError, binascii.Error) as error:
        raise ValueError(f"invalid dataset key document: {error}") from None
    return tenant, secret


def loads(text: str) -> tuple[str, bytes]:
    """The tenant and secret of a document; ``ValueError`` if it is not a valid one."""
    try:
        document = json.loads(text)
    except ValueError as error:
        raise ValueError(f"invalid dataset key document: {error}") from None
    return from_document(document)


def load_or_create(path: Path, tenant: str) -> tuple[str, bytes]:
    """The tenant and secret of the key in ``path``, a fresh key for ``tenant`` written there (0600) on first use."""
    try:
        return loads(path.read_text())
    except FileNotFoundError:
        secret = os.urandom(KEY_SIZE)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(dumps(tenant, secret) + "\n")
        return tenant, secret
