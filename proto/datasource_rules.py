"""The rules of a data source's credentials, shared by the SDK, the CLI, the server and the worker.

A data source is S3 (``kind="s3"``) or Azure Blob (``"az"``) credentials a
tenant registers for its jobs. The SDK checks a registration before sending
it, the server before sealing it, the worker the document it is handed; all
with :func:`credentials_problem` and :func:`dataset_key_problem`. What the
server alone checks (the name, the endpoint URL) stays in
:mod:`cantata.server.datasource_store`.
"""

from __future__ import annotations

from collections.abc import Mapping

from cantata.proto.vocabulary import DATA_SOURCE_SECRETS
from cantata.storage import uri as stores

KINDS = tuple(DATA_SOURCE_SECRETS)
DATASET_KEY_SIZE = 32  # bytes of a tenant's dataset key (AES-256)
S3_REQUIRED = ("access_key_id", "secret_access_key")
AZURE_ANY_OF = ("connection_string", "account_key", "sas_token")


def credentials_problem(kind: str, secrets: Mapping[str, object]) -> str | None:
    """Why ``secrets`` are not credentials of a ``kind`` data source, as ``"FIELD: why"``; None if they are."""
    if kind not in KINDS:  # a store that joined the registry (cantata.storage.uri) maps its own secrets
        scheme = stores.SCHEMES.get(kind)
        if scheme is not None and scheme.credentials is not None:
            return None
        return f"kind: must be one of {', '.join(KINDS)}, not {kind!r}"
    unknown = sorted(set(secrets) - set(DATA_SOURCE_SECRETS[kind]), key=str)
    if unknown:
        return f"credentials: unknown fields {unknown} for {kind}"
    not_text = sorted(field for field, value in secrets.items() if not isinstance(value, str))
    if not_text:
        return f"credentials: {not_text} must be strings"
    given = {field for field, value in secrets.items() if value}
    if kind == "s3" and not set(S3_REQUIRED) <= given:
        return f"credentials: S3 needs {' and '.join(S3_REQUIRED)}"
    if kind == "az" and not given & set(AZURE_ANY_OF):
        return f"credentials: Azure needs {', '.join(AZURE_ANY_OF[:-1])} or {AZURE_ANY_OF[-1]}"
    if "account_key" in given and "account_name" not in given:
        return "credentials: account_key needs account_name"
    return None


def dataset_key_problem(dataset_key: bytes | None) -> str | None:
    """Why ``dataset_key`` (None: none) cannot be a data source's dataset key; None if it can."""
    if dataset_key is not None and len(dataset_key) != DATASET_KEY_SIZE:
        return f"dataset_key: must be {DATASET_KEY_SIZE} bytes, not {len(dataset_key)}"
    return None
