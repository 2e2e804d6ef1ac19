"""Shared fixtures: a real server per test module, over TLS on loopback.

Tests that start a server, worker processes, moto or Azurite are marked
``integration`` here, from the fixtures they use (a test that starts them
itself says so with ``pytest.mark.integration``), and get a higher timeout;
``make test-fast`` runs the others (``-m "not integration"``).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from testkit.platform import Platform

pytest_plugins = ["tests.services"]

torch.set_num_threads(1)

# Fixtures that start (or talk to) a server, its workers, moto or Azurite;
# boto3_session is only ever used against moto.
INTEGRATION_FIXTURES = frozenset(
    {
        "platform",
        "tenant",
        "moto_service",
        "moto_auth_service",
        "azurite_service",
        "s3_store",
        "azure_store",
        "boto3_session",
    }
)
# Parameters of tests.services' ``blob_store`` that need moto or Azurite.
REMOTE_BLOB_STORES = frozenset({"s3", "azure"})
# Integration tests wait for real processes, perhaps on a loaded machine: their
# ceiling (a hang detector, see testkit/waiting.py) is above the default 300 s.
INTEGRATION_TIMEOUT_S = 900


def pytest_configure(config: pytest.Config) -> None:
    """A temp root of this session's own: pytest keeps resetting its shared ``pytest-of-<user>`` to 0700,
    and as root the server's workers (other uids) must pass through to a test's data dir
    (``testkit.platform.passable``)."""
    if config.option.basetemp is None:
        config.option.basetemp = Path(tempfile.mkdtemp(prefix="cantata-tests-")) / "t"
        config.add_cleanup(lambda: shutil.rmtree(config.option.basetemp.parent, ignore_errors=True))


def is_integration(item: pytest.Item) -> bool:
    """Whether ``item`` starts a server, workers, moto or Azurite."""
    if item.get_closest_marker("integration"):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("blob_store") in REMOTE_BLOB_STORES:
        return True
    return not INTEGRATION_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if is_integration(item):
            item.add_marker(pytest.mark.integration)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(INTEGRATION_TIMEOUT_S))


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(tmp_path_factory.mktemp("platform"))
    p.start()
    yield p
    if p.proc is not None:
        p.stop()


@pytest.fixture(scope="module")
def tenant(platform):
    """An approved tenant's client on the module's server."""
    with platform.enroll("acme") as client:
        yield client
