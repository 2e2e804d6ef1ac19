"""``file://`` datasets and checkpoint stores are scoped to their tenant, on a real server.

Tenant globex cannot train on acme's files, cannot put its checkpoints in
acme's folder, and cannot tell acme's folders that exist from those that do
not; nothing in the platform's data directory is a dataset, whatever root the
admin grants. Parsing rules are also checked directly on ``parse_job_spec``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from cantata.proto.v1 import common_pb2
from cantata.sdk import errors
from cantata.sdk.job import Job
from cantata.server.jobs.jobspec import InvalidField, parse_job_spec
from cantata.server.workers.local_roots import LocalRoots

QUICK: dict[str, Any] = dict(model="gpt-tiny", steps=10, batch_size=2, seq_len=16)


@pytest.fixture(scope="module")
def acme_data(platform) -> Path:
    folder = platform.tenant_dir("acme", "corpus")
    (folder / "a.txt").write_text("acme's private text " * 100)
    return folder


@pytest.fixture(scope="module")
def globex(platform):
    with platform.enroll("globex") as client:
        yield client


def _said(error: errors.InvalidJob, path: Path) -> str:
    """What the refusal says, with the path it names and its request id left out."""
    return re.sub(r" \(request \w+\)", "", str(error)).replace(str(path), "PATH")


def _refusal(client, **fields) -> errors.InvalidJob:
    with pytest.raises(errors.InvalidJob) as err:
        client.submit(Job(name="probe", **QUICK, **fields))
    return err.value


def test_a_tenant_cannot_train_on_another_tenants_files_nor_tell_whether_they_exist(platform, globex, acme_data):
    present = _refusal(globex, dataset=acme_data.as_uri())
    missing_path = acme_data.parent / "no-such-corpus"
    missing = _refusal(globex, dataset=missing_path.as_uri())
    assert present.field == missing.field == "dataset"
    assert _said(present, acme_data) == _said(missing, missing_path)
    assert "outside the allowed roots" in str(present)
    # The shared root itself and acme's folder are no more open than what is in them.
    for place in (platform.shared_root, platform.shared_root / "acme"):
        assert _refusal(globex, dataset=place.as_uri()).field == "dataset"
    assert globex.list() == []


def test_a_tenant_cannot_write_checkpoints_into_another_tenants_folder(platform, tenant, globex, acme_data):
    acme_store = platform.data_dir / "checkpoints" / "acme"
    acme_store.mkdir(exist_ok=True)
    for store in (acme_store, acme_store / "deeper", platform.shared_root / "acme", acme_data):
        assert _refusal(globex, checkpoint_store=store.as_uri()).field == "checkpoint_store"
    for store in (platform.data_dir, platform.data_dir / "jobs", platform.data_dir / "audit"):
        assert _refusal(globex, checkpoint_store=store.as_uri()).field == "checkpoint_store"
    # acme's own folder is its to use: its worker (another uid, as root) writes its checkpoints there.
    handle = tenant.submit(Job(name="own-store", checkpoint_store=acme_store.as_uri(), checkpoint_every=5, **QUICK))
    assert handle.wait().state == "SUCCEEDED"
    assert tenant.checkpoints(handle.id)


def _spec(**fields) -> common_pb2.JobSpec:
    return common_pb2.JobSpec(name="x", steps=10, **fields)


def test_the_data_directory_is_never_a_root_even_under_a_granted_one(tmp_path):
    data_dir = tmp_path / "srv" / "cantata"
    roots = LocalRoots(
        data_dir=data_dir,
        default_store=data_dir / "checkpoints",
        shared=(tmp_path / "srv",),
        granted={"acme": (tmp_path,)},
    )
    default = (data_dir / "checkpoints").as_uri()

    def parse(tenant: str, **fields) -> common_pb2.JobSpec:
        return parse_job_spec(
            _spec(**fields),
            default_store=default,
            roots=roots.datasets(tenant),
            store_roots=roots.stores(tenant),
            data_dir=data_dir,
        )

    for inside in (data_dir, data_dir / "jobs", data_dir / "checkpoints" / "acme"):
        with pytest.raises(InvalidField) as err:
            parse("acme", dataset=inside.as_uri())
        assert err.value.field == "dataset"
    with pytest.raises(InvalidField):  # a tenant named like the data directory gets no way in
        parse("cantata", dataset=(data_dir / "jobs").as_uri())
    with pytest.raises(InvalidField):
        parse("cantata", checkpoint_store=(data_dir / "jobs").as_uri())
    with pytest.raises(InvalidField):
        parse("acme", checkpoint_store=(data_dir / "jobs").as_uri())
    assert parse("acme", dataset=(tmp_path / "elsewhere").as_uri()).dataset.endswith("/elsewhere")  # granted
    assert parse("acme", checkpoint_store=(data_dir / "checkpoints" / "acme" / "x").as_uri())
    assert parse("acme").checkpoint_store == default
    with pytest.raises(InvalidField):
        parse("globex", checkpoint_store=(data_dir / "checkpoints" / "acme").as_uri())


def test_under_a_shared_root_only_the_tenants_own_folder_is_its_whatever_the_admin_granted(tmp_path):
    shared = tmp_path / "shared"
    data_dir = tmp_path / "cantata"
    roots = LocalRoots(
        data_dir=data_dir,
        default_store=data_dir / "checkpoints",
        shared=(shared,),
        granted={"globex": (shared / "acme" / "corpus", tmp_path)},  # the admin's mistakes
    )

    def parse(**fields) -> common_pb2.JobSpec:
        return parse_job_spec(
            _spec(**fields),
            default_store=(data_dir / "checkpoints").as_uri(),
            roots=roots.datasets("globex"),
            store_roots=roots.stores("globex"),
            data_dir=data_dir,
            own_folders=roots.own_folders("globex"),
        )

    for field in ("dataset", "checkpoint_store"):
        for place in (shared / "acme" / "corpus", shared / "acme" / "corpus" / "deeper", shared / "acme", shared):
            with pytest.raises(InvalidField) as err:
                parse(**{field: place.as_uri()})
            assert err.value.field == field
            assert f"outside your folder of it ({shared / 'globex'})" in str(err.value)
    assert parse(dataset=(shared / "globex" / "corpus").as_uri()).dataset.endswith("/shared/globex/corpus")
    assert parse(dataset=(tmp_path / "elsewhere").as_uri()).dataset.endswith("/elsewhere")  # granted, not shared
