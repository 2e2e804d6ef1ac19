"""The log level of the storage SDKs and their HTTP stacks (Azure, boto, urllib3): WARNING unless asked.

At INFO the Azure SDK logs every request's and response's headers, and boto
logs each call at DEBUG: a server or worker that logs its own INFO lines must
not pass theirs on. ``$CANTATA_THIRD_PARTY_LOG_LEVEL`` (or the server's
``--third-party-log-level``) asks for more while debugging a store.
"""

from __future__ import annotations

import logging
import os

LEVEL_ENV = "CANTATA_THIRD_PARTY_LOG_LEVEL"
DEFAULT_LEVEL = "WARNING"
THIRD_PARTY_LOGGERS = ("azure", "botocore", "boto3", "s3transfer", "urllib3")


def set_third_party_log_level(level: str | None = None) -> str:
    """Set every third-party logger to ``level``, else ``$CANTATA_THIRD_PARTY_LOG_LEVEL``, else WARNING.

    Returns the level's name; an unknown name is a ``ValueError``.
    """
    name = (level or os.environ.get(LEVEL_ENV) or DEFAULT_LEVEL).upper()
    if name not in logging.getLevelNamesMapping():
        raise ValueError(f"{LEVEL_ENV}: unknown log level {name!r}")
    for logger in THIRD_PARTY_LOGGERS:
        logging.getLogger(logger).setLevel(name)
    return name
