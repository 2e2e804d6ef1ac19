"""Jobs checkpoint sealed into every kind of store; the store never sees plaintext; tampering is refused."""

from __future__ import annotations

import uuid

import pytest
import torch

from cantata.sdk import errors
from cantata.sdk.job import Job
from cantata.security.sealed_checkpoint import object_key
from cantata.storage import open_store
from testkit.platform import Platform
from tests.services import S3_TEST_CREDENTIALS, azurite_connection_string

QUICK = dict(steps=20, eval_every=10, checkpoint_every=10, batch_size=4, seq_len=16)


@pytest.fixture(scope="module")
def stores(moto_service, azurite_service):
    bucket, container = f"ckpt-{uuid.uuid4().hex[:12]}", f"ckpt-{uuid.uuid4().hex[:12]}"
    connection = azurite_connection_string(azurite_service.endpoint)
    s3 = open_store(f"s3://{bucket}/jobs", endpoint_url=moto_service.endpoint, **S3_TEST_CREDENTIALS)
    s3.client.create_bucket(Bucket=bucket)
    az = open_store(f"az://{container}/jobs", connection_string=connection)
    az.container.create_container()
    env = {
        "AWS_ENDPOINT_URL": moto_service.endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AZURE_STORAGE_CONNECTION_STRING": connection,
    }
    return {"s3": (f"s3://{bucket}/jobs", s3), "az": (f"az://{container}/jobs", az), "env": env}


@pytest.fixture(scope="module")
def platform(tmp_path_factory, stores):
    p = Platform(tmp_path_factory.mktemp("platform"), env=stores["env"])
    p.start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def finished(platform, tenant, stores):
    """One finished job per remote store (the local one is covered by test_jobs), and one saving asynchronously."""
    jobs = {}
    for kind in ("s3", "az", "s3-async"):
        store, asynchronous = kind.removesuffix("-async"), kind.endswith("-async")
        job = Job(name=f"on-{kind}", checkpoint_store=stores[store][0], async_checkpoint=asynchronous, **QUICK)
        status = tenant.submit(job).wait()
        assert status.state == "SUCCEEDED", status.reason
        jobs[kind] = status.id
    return jobs


@pytest.mark.parametrize("kind", ["s3", "az", "s3-async"])
def test_job_checkpoints_are_sealed_in_the_store(tenant, stores, finished, kind, tmp_path):
    job_id = finished[kind]
    assert [c.step for c in tenant.checkpoints(job_id)] == [10, 20]
    store = stores[kind.removesuffix("-async")][1]
    names = store.list("acme/")
    assert any(name.endswith("MANIFEST.sealed") for name in names)
    raw = b"".join(store.get_bytes(n) for n in names if job_id in n)
    assert b"tok_emb" not in raw and b"PK\x03\x04" not in raw  # no torch zip, no parameter names
    state = torch.load(tenant.download_checkpoint(job_id, 20, tmp_path / "m.pt"), weights_only=True)
    assert state["lm_head.weight"].shape == (256, 64)


def test_a_tampered_checkpoint_is_refused_before_use(tenant, stores, finished, tmp_path):
    job_id = finished["s3"]
    store = stores["s3"][1]
    key = object_key("acme", job_id, 10, "model")
    body = bytearray(store.get_bytes(key))
    body[len(body) // 2] ^= 0x01
    store.put(key, [bytes(body)])
    with pytest.raises(errors.DataLoss, match="failed verification"):
        tenant.download_checkpoint(job_id, 10, tmp_path / "bad.pt")
    assert not (tmp_path / "bad.pt").exists() and not (tmp_path / "bad.pt.part").exists()


def test_key_rotation_rewraps_checkpoints_and_they_still_load(platform, tenant, finished, tmp_path):
    with platform.admin() as admin:
        rotation = admin.rotate_tenant_key("acme", retire_unused=True)
    assert rotation.version == 2 and rotation.objects_rewrapped > 0 and rotation.retired == [1]
    state = torch.load(tenant.download_checkpoint(finished["az"], 20, tmp_path / "m.pt"), weights_only=True)
    assert "tok_emb.weight" in state


def test_another_tenant_cannot_list_or_download(platform, finished, tmp_path):
    with platform.enroll("intruder") as intruder:
        with pytest.raises(errors.NotFound):
            intruder.checkpoints(finished["az"])
        with pytest.raises(errors.NotFound):
            intruder.download_checkpoint(finished["az"], 20, tmp_path / "x.pt")


def test_a_byte_gpt_checkpoint_is_not_offered_as_a_hugging_face_folder(tenant, finished, tmp_path):
    with pytest.raises(errors.InvalidArgument, match="format hf: gpt-tiny is a byte GPT"):
        tenant.download_checkpoint(finished["s3"], 20, tmp_path / "hf", format="hf")
    assert list(tmp_path.iterdir()) == []
