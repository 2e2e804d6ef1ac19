"""Shared fixtures: a real server per test module, over TLS on loopback."""

from __future__ import annotations

import pytest
import torch

from tests.platform import Platform

pytest_plugins = ["tests.services"]

torch.set_num_threads(1)


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
