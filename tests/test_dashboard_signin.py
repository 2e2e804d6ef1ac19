"""Login links and sessions of the web dashboard, on a clock the test moves."""

from __future__ import annotations

import pytest

from cantata.security.pki import Principal
from cantata.server.dashboard.signin import LoginRefused, SignIn

ACME = Principal.tenant("acme")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def signin(clock) -> SignIn:
    return SignIn(link_seconds=60, session_seconds=3600, clock=clock)


def test_a_link_opens_one_session_bound_to_its_principal(signin):
    token = signin.issue(ACME, serial=7)
    session_id, session = signin.redeem(token)
    assert session.principal == ACME and session.serial == 7
    assert signin.session(session_id) == session
    assert signin.session(token) is None  # the link is not a session id
    with pytest.raises(LoginRefused) as refused:
        signin.redeem(token)
    assert refused.value.reason == "used" and refused.value.principal == ACME


def test_a_link_expires_and_is_refused_by_name_after_newer_ones(signin, clock):
    token = signin.issue(ACME, serial=7)
    clock.now += 60
    signin.issue(ACME, serial=7)  # issuing forgets only links long past their end
    with pytest.raises(LoginRefused) as refused:
        signin.redeem(token)
    assert refused.value.reason == "expired" and refused.value.principal == ACME


def test_an_unknown_link_names_nobody(signin):
    with pytest.raises(LoginRefused) as refused:
        signin.redeem("not-a-token")
    assert refused.value.reason == "unknown" and refused.value.principal is None


def test_a_session_expires(signin, clock):
    session_id, _ = signin.redeem(signin.issue(ACME, serial=7))
    clock.now += 3599
    assert signin.session(session_id) is not None
    clock.now += 1
    assert signin.session(session_id) is None
