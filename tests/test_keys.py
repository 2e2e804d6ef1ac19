"""Master key, encrypted keyring, job-scoped keys, rotation and retirement."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from cantata.security.keys import (
    MASTER_KEY_ENV,
    JobKeys,
    KeyringCorruptError,
    KeyringError,
    KeyUnwrapError,
    LocalKeyring,
    MasterKey,
    MasterKeyError,
    UnknownKeyVersionError,
    UnknownTenantError,
)

DATA_KEY = os.urandom(32)


@pytest.fixture
def master_key(tmp_path: Path) -> MasterKey:
    return MasterKey.create_file(tmp_path / "master.key")


@pytest.fixture
def keyring(tmp_path: Path, master_key: MasterKey) -> LocalKeyring:
    ring = LocalKeyring(tmp_path / "data" / "keyring.sealed", master_key)
    ring.ensure_tenant("acme")
    return ring


def test_master_key_file_is_private_and_reloads(tmp_path: Path) -> None:
    path = tmp_path / "master.key"
    created = MasterKey.create_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    ring = LocalKeyring(tmp_path / "ring", created)
    ring.ensure_tenant("acme")
    assert LocalKeyring(tmp_path / "ring", MasterKey.from_file(path)).versions("acme")[0].version == 1
    with pytest.raises(FileExistsError):
        MasterKey.create_file(path)


def test_master_key_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    key = os.urandom(32)
    monkeypatch.setenv(MASTER_KEY_ENV, base64.b64encode(key).decode())
    LocalKeyring(tmp_path / "ring", MasterKey.from_env()).ensure_tenant("acme")
    assert [v.version for v in LocalKeyring(tmp_path / "ring", MasterKey(key)).versions("acme")] == [1]
    monkeypatch.delenv(MASTER_KEY_ENV)
    with pytest.raises(MasterKeyError):
        MasterKey.from_env()


@pytest.mark.parametrize("text", ["not base64!", base64.b64encode(b"short").decode()])
def test_malformed_master_key(text: str) -> None:
    with pytest.raises(MasterKeyError):
        MasterKey.parse(text)


def test_keyring_file_holds_no_plaintext(tmp_path: Path, keyring: LocalKeyring) -> None:
    keyring.rotate("acme")
    path = tmp_path / "data" / "keyring.sealed"
    raw = path.read_bytes()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert b"acme" not in raw and b"key" not in raw
    for key in keyring.job_keys("acme", "job-1").keys.values():
        assert key.secret not in raw and base64.b64encode(key.secret) not in raw


def test_keyring_refuses_a_wrong_master_key_or_a_modified_file(tmp_path: Path, keyring: LocalKeyring) -> None:
    path = tmp_path / "data" / "keyring.sealed"
    with pytest.raises(KeyringCorruptError):
        LocalKeyring(path, MasterKey(os.urandom(32)))
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(KeyringCorruptError):
        LocalKeyring(path, MasterKey.from_file(tmp_path / "master.key"))


def test_job_keys_survive_a_reopen(tmp_path: Path, master_key: MasterKey, keyring: LocalKeyring) -> None:
    envelope = keyring.job_keys("acme", "job-1").current.wrap(DATA_KEY)
    reopened = LocalKeyring(tmp_path / "data" / "keyring.sealed", master_key)
    assert reopened.job_keys("acme", "job-1").unwrap(envelope) == DATA_KEY


def test_job_keys_are_scoped_to_their_job_and_tenant(keyring: LocalKeyring) -> None:
    keyring.ensure_tenant("globex")
    envelope = keyring.job_keys("acme", "job-1").current.wrap(DATA_KEY)
    for tenant, job in [("acme", "job-2"), ("globex", "job-1")]:
        with pytest.raises(KeyUnwrapError):
            keyring.job_keys(tenant, job).unwrap(envelope)


def test_data_source_keys_are_no_jobs_keys(keyring: LocalKeyring) -> None:
    keyring.ensure_tenant("globex")
    envelope = keyring.data_source_keys("acme").current.wrap(DATA_KEY)
    assert keyring.data_source_keys("acme").unwrap(envelope) == DATA_KEY
    for keys in (keyring.job_keys("acme", "job-1"), keyring.data_source_keys("globex")):
        with pytest.raises(KeyUnwrapError):  # a worker's job keys, or another tenant's, do not open it
            keys.unwrap(envelope)


def test_unknown_tenant(keyring: LocalKeyring) -> None:
    with pytest.raises(UnknownTenantError):
        keyring.job_keys("nobody", "job-1")


def test_rotation_keeps_old_versions_readable_until_retired(keyring: LocalKeyring) -> None:
    old_envelope = keyring.job_keys("acme", "job-1").current.wrap(DATA_KEY)
    assert keyring.rotate("acme") == 2
    keys = keyring.job_keys("acme", "job-1")
    assert keys.current.version == 2 and keys.versions == [1, 2]
    assert keys.unwrap(old_envelope) == DATA_KEY
    keyring.retire("acme", 1)
    assert [(v.version, v.active) for v in keyring.versions("acme")] == [(1, False), (2, True)]
    with pytest.raises(UnknownKeyVersionError):
        keyring.job_keys("acme", "job-1").unwrap(old_envelope)


def test_the_current_version_cannot_be_retired(keyring: LocalKeyring) -> None:
    with pytest.raises(KeyringError):
        keyring.retire("acme", 1)


def test_retire_unused_keeps_versions_in_use_and_the_current_one(keyring: LocalKeyring) -> None:
    keyring.rotate("acme")
    keyring.rotate("acme")
    keyring.rotate("acme")
    assert keyring.retire_unused("acme", in_use={2}) == [1, 3]
    assert keyring.job_keys("acme", "job-1").versions == [2, 4]


def test_job_keys_round_trip_through_a_worker_config(keyring: LocalKeyring) -> None:
    keyring.rotate("acme")
    keys = keyring.job_keys("acme", "job-1")
    copy = JobKeys.from_json(keys.to_json())
    assert copy == keys
    assert copy.unwrap(keys.current.wrap(DATA_KEY)) == DATA_KEY
    assert repr(keys.current) == "JobKey(tenant='acme', job_id='job-1', version=2)"


@pytest.mark.parametrize("text", ["{}", "not json", '{"tenant": "a", "job_id": "j", "keys": {"1": "c2hvcnQ="}}'])
def test_malformed_job_keys_document(text: str) -> None:
    with pytest.raises(KeyringError):
        JobKeys.from_json(text)


def test_envelopes_from_another_version_are_refused_by_a_single_key(keyring: LocalKeyring) -> None:
    keyring.rotate("acme")
    keys = keyring.job_keys("acme", "job-1")
    envelope = keys.keys[2].wrap(DATA_KEY)
    with pytest.raises(KeyUnwrapError):
        keys.keys[1].unwrap(envelope)
