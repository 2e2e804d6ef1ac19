"""Jobs on tenant datasets, end to end: prepared shards on local disk, moto S3 and Azurite, sealed or not.

Every job here is a real server launching real workers that stream the data
through the loader; the data sources are registered through the SDK.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import Request, urlopen

import numpy as np
import pytest

from cantata.sdk import InvalidJob, NotFound
from cantata.sdk.job import Job
from cantata.storage import open_store
from cantata.storage.s3 import S3Store
from cantata.trainer.data import DataLoader, DatasetKey, SourceCredentials, open_dataset
from cantata.trainer.data.prepare import prepare_shards
from cantata.trainer.data.shards import dtype_for, encode_shard
from cantata.trainer.data.upload import upload_shards
from testkit.platform import readable
from testkit.waiting import JOB_TIMEOUT_S, wait_for
from tests.services import AZURITE_ACCOUNT, AZURITE_KEY, azurite_connection_string
from tests.test_decentralized_jobs import _events_so_far, _worker_of
from tests.test_jobs import _pids_of

SHARD_TOKENS = 40_000
QUICK = dict(model="gpt-tiny", steps=30, eval_every=30, checkpoint_every=30, batch_size=4, seq_len=32)
MOTO_ACCESS_KEY = "AKIACANTATADATATEST"
MOTO_SECRET = "moto-secret-that-must-never-be-shown"


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """About 320k tokens of Python source as text, prepared into 8 shards."""
    text = tmp_path_factory.mktemp("text")
    source = Path(np.__file__).parent
    written = 0
    for index, path in enumerate(sorted(source.rglob("*.py"))):
        body = path.read_text(errors="ignore")
        (text / f"{index:04d}.txt").write_text(body)
        written += len(body.encode())
        if written > 8 * SHARD_TOKENS:
            break
    out = tmp_path_factory.mktemp("shards") / "out"
    result = prepare_shards(text, out, dtype=np.dtype("uint16"), shard_tokens=SHARD_TOKENS)
    assert len(result.shards) >= 8
    return out


@pytest.fixture(scope="module")
def local_dataset(platform, shards) -> str:
    """The shards in the tenant's folder of the server's allowed root, as a file:// dataset."""
    target = platform.tenant_dir("acme", "datasets") / "python"
    shutil.copytree(shards, target)
    return readable(target).as_uri()


def _messages(handle) -> list[str]:
    return [event.message for event in handle.events()]


def _losses(handle) -> list[float]:
    return [event.loss for event in handle.events() if event.kind == "PROGRESS"]


def _s3_source(tenant, shards, moto_service, name: str) -> str:
    """Upload the shards to a fresh moto bucket; register source ``name`` for it; return the dataset URI."""
    bucket = f"data-{uuid.uuid4().hex[:12]}"
    store = open_store(
        f"s3://{bucket}/python",
        endpoint_url=moto_service.endpoint,
        region_name="us-east-1",
        aws_access_key_id=MOTO_ACCESS_KEY,
        aws_secret_access_key=MOTO_SECRET,
    )
    assert isinstance(store, S3Store)
    store.client.create_bucket(Bucket=bucket)
    upload_shards(shards, store)
    tenant.register_data_source(
        name,
        kind="s3",
        endpoint=moto_service.endpoint,
        credentials={"access_key_id": MOTO_ACCESS_KEY, "secret_access_key": MOTO_SECRET},
    )
    return f"s3://{name}@{bucket}/python"


def test_a_two_worker_job_trains_from_local_shards(tenant, local_dataset):
    handle = tenant.submit(Job(name="local-shards", dataset=local_dataset, workers=2, algorithm="allreduce", **QUICK))
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    losses = _losses(handle)
    assert losses[-1] < losses[0] - 0.5 and math.isfinite(status.val_loss)
    messages = _messages(handle)
    assert any(m.startswith(f"data progress: {local_dataset}: fetched") for m in messages)
    assert any(m.startswith("data wait ") and "of training time" in m for m in messages)


def test_a_job_trains_from_s3_through_a_registered_data_source(platform, tenant, shards, moto_service):
    handle = tenant.submit(Job(name="s3-shards", dataset=_s3_source(tenant, shards, moto_service, "lake"), **QUICK))
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    assert _losses(handle)[-1] < _losses(handle)[0] - 0.5

    seen = "\n".join(_messages(handle)) + "\n".join(line for _, line in handle.logs()) + platform.server_log()
    seen += "".join(p.read_text(errors="replace") for p in (platform.data_dir / "audit").rglob("*") if p.is_file())
    assert MOTO_SECRET not in seen and MOTO_ACCESS_KEY not in seen


def _secret_files(workspace: Path) -> list[str]:
    return sorted(p.name for p in workspace.iterdir() if p.name.endswith((".json", ".key")))


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def test_worker_secrets_are_on_disk_only_while_the_workers_run(platform, tenant, shards, moto_service):
    dataset = _s3_source(tenant, shards, moto_service, "scrubbed")
    handle = tenant.submit(Job(name="scrubbed", dataset=dataset, workers=2, algorithm="allreduce", **QUICK))
    workspace = platform.paths.jobs / handle.id
    wait_for(
        lambda: MOTO_SECRET in _text(workspace / "worker-1.json"), timeout=JOB_TIMEOUT_S
    )  # the running workers' configs hold it
    assert handle.wait().state == "SUCCEEDED"
    assert _secret_files(workspace) == []  # configs and certificate keys gone with the job ...
    assert any("finished, validation loss" in line for _, line in handle.logs())  # ... its logs kept

    platform.stop()  # leftovers of a server that died before scrubbing are scrubbed at start
    (workspace / "worker-0.json").write_text(json.dumps({"dataset_credentials": MOTO_SECRET}))
    (workspace / "worker-0.key").write_text("-----BEGIN PRIVATE KEY-----")
    platform.start()
    assert _secret_files(workspace) == []


def test_a_restarted_worker_gets_the_current_secrets_not_a_stale_copy(platform, tenant, shards, moto_service):
    dataset = _s3_source(tenant, shards, moto_service, "doomed")
    handle = tenant.submit(
        Job(
            name="doomed",
            dataset=dataset,
            workers=2,
            algorithm="gasloc",
            local_steps=5,
            steps=5000,
            eval_every=5000,
            checkpoint_every=5000,
            batch_size=4,
            seq_len=16,
        )
    )
    wait_for(lambda: handle.status().step >= 10, timeout=JOB_TIMEOUT_S)
    tenant.delete_data_source("doomed")
    os.kill(next(pid for pid in _pids_of(handle.id) if _worker_of(pid) == 1), 9)
    status = handle.wait()
    assert status.state == "FAILED"
    assert "worker 1 exited with code -9" in status.reason, status.reason
    assert "cannot restart it: data source 'doomed' not found" in status.reason, status.reason
    assert _secret_files(platform.paths.jobs / handle.id) == []


def test_a_job_trains_from_encrypted_shards_on_azure(tenant, shards, azurite_service):
    container = f"data-{uuid.uuid4().hex[:12]}"
    connection = azurite_connection_string(azurite_service.endpoint)
    store = open_store(f"az://{container}/python", connection_string=connection)
    store.container.create_container()
    key = DatasetKey.generate("acme")
    keys = upload_shards(shards, store, dataset_key=key)
    assert all(k.endswith(".tok.sealed") for k in keys)
    assert b"import" not in store.get_bytes(keys[0])  # the store holds ciphertext only
    tenant.register_data_source(
        "vault", kind="az", credentials={"connection_string": connection}, dataset_key=key.secret
    )

    handle = tenant.submit(Job(name="sealed-shards", dataset=f"az://vault@{container}/python", **QUICK))
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    assert _losses(handle)[-1] < _losses(handle)[0] - 0.5

    tenant.register_data_source(
        "vault",
        kind="az",
        credentials={"connection_string": connection},
        dataset_key=DatasetKey.generate("acme").secret,
        replace=True,
    )
    status = tenant.submit(Job(name="wrong-key", dataset=f"az://vault@{container}/python", **QUICK)).wait()
    assert status.state == "FAILED"
    assert "SealedShardError: encrypted shard" in status.reason and container in status.reason


def test_an_s3_dataset_too_small_for_validation_fails_at_start_without_fetching_an_object(
    platform, tenant, small_shards, moto_service
):
    """40 shards of 1,000 tokens hold 40 x 4 validation windows of 17 tokens; 80 batches of 4 need 320."""
    dataset = _s3_source(tenant, small_shards, moto_service, "too-small")
    _moto_recorder(moto_service, "reset-recording")
    _moto_recorder(moto_service, "start-recording")
    try:
        status = tenant.submit(
            Job(
                name="too-small", dataset=dataset, model="gpt-tiny", steps=60, batch_size=4, seq_len=16, eval_batches=80
            )
        ).wait()
    finally:
        _moto_recorder(moto_service, "stop-recording")
    assert status.state == "FAILED" and status.step == 0
    assert "too small for the job's validation: it holds at most 160 validation windows" in status.reason
    assert "eval_batches=80 x batch_size=4 needs 320" in status.reason
    recorded = [json.loads(line) for line in _moto_recorder(moto_service, "download-recording").splitlines() if line]
    fetched = [r["url"] for r in recorded if r["method"] == "GET" and urlsplit(r["url"]).path.endswith(".tok")]
    assert fetched == []  # the listing's sizes were enough


def test_a_dataset_must_name_a_data_source_of_the_tenant(platform, tenant):
    with pytest.raises(InvalidJob, match="names no data source"):
        tenant.submit(Job(name="ambient", dataset="s3://bucket/prefix", **QUICK))
    with pytest.raises(NotFound, match="data source 'nowhere' not found"):
        tenant.submit(Job(name="unknown", dataset="s3://nowhere@bucket/prefix", **QUICK))
    tenant.register_data_source("private", kind="s3", credentials={"access_key_id": "a", "secret_access_key": "b"})
    with platform.enroll("globex") as other:
        with pytest.raises(NotFound, match="data source 'private' not found"):
            other.submit(Job(name="probe", dataset="s3://private@bucket/prefix", **QUICK))
        assert other.list() == []


@pytest.mark.parametrize("case", ["missing bucket", "empty prefix", "wrong azure credentials", "wrong s3 credentials"])
def test_bad_datasets_fail_the_job_naming_the_object(
    tenant, shards, moto_service, moto_auth_service, azurite_service, case
):
    bucket = f"bad-{uuid.uuid4().hex[:12]}"
    if case == "wrong azure credentials":
        store = open_store(
            f"az://{bucket}/python", connection_string=azurite_connection_string(azurite_service.endpoint)
        )
        store.container.create_container()
        upload_shards(shards, store)
        wrong_key = AZURITE_KEY[:-8] + "AAAAAAA="
        tenant.register_data_source(
            f"src-{bucket}",
            kind="az",
            endpoint=f"{azurite_service.endpoint}",
            credentials={"account_name": AZURITE_ACCOUNT, "account_key": wrong_key},
        )
        dataset, expected = f"az://src-{bucket}@{bucket}/python", "DatasetAccessError"
    elif case == "wrong s3 credentials":
        s3 = moto_auth_service
        store = open_store(
            f"s3://{bucket}/python",
            endpoint_url=s3.endpoint,
            region_name="us-east-1",
            aws_access_key_id=s3.access_key_id,
            aws_secret_access_key=s3.secret_access_key,
        )
        store.client.create_bucket(Bucket=bucket)
        upload_shards(shards, store)
        tenant.register_data_source(
            f"src-{bucket}",
            kind="s3",
            endpoint=s3.endpoint,
            credentials={"access_key_id": s3.access_key_id, "secret_access_key": "not-" + s3.secret_access_key},
        )
        dataset = f"s3://src-{bucket}@{bucket}/python"
        expected = f"DatasetAccessError: listing s3://{bucket}/python/: the store refused the credentials"
    else:
        if case == "empty prefix":
            store = open_store(
                f"s3://{bucket}/",
                endpoint_url=moto_service.endpoint,
                region_name="us-east-1",
                aws_access_key_id=MOTO_ACCESS_KEY,
                aws_secret_access_key=MOTO_SECRET,
            )
            store.client.create_bucket(Bucket=bucket)
        tenant.register_data_source(
            f"src-{bucket}",
            kind="s3",
            endpoint=moto_service.endpoint,
            credentials={"access_key_id": MOTO_ACCESS_KEY, "secret_access_key": MOTO_SECRET},
        )
        dataset = f"s3://src-{bucket}@{bucket}/python"
        expected = "DatasetNotFoundError"
    status = tenant.submit(Job(name=case.replace(" ", "-"), dataset=dataset, **QUICK)).wait()
    assert status.state == "FAILED"
    assert expected in status.reason and bucket in status.reason, status.reason


@pytest.mark.parametrize("policy", ["skip", "fail"])
def test_text_that_is_not_utf8_is_skipped_with_a_warning_or_fails_by_policy(platform, tenant, policy):
    folder = platform.tenant_dir("acme", "datasets", f"text-{policy}")
    source = Path(np.__file__).parent
    for index, path in enumerate(sorted(source.glob("*.py"))[:6]):
        (folder / f"{index}.txt").write_bytes(path.read_bytes())
    (folder / "2.txt").write_bytes(b"caf\xe9 latin-1, not UTF-8 " * 200)
    readable(folder)
    status = tenant.submit(Job(name=f"utf8-{policy}", dataset=folder.as_uri(), on_bad_utf8=policy, **QUICK))
    status = status.wait()
    bad = f"{folder.as_uri()}/2.txt"
    if policy == "skip":
        assert status.state == "SUCCEEDED", status.reason
        warnings = [m for m in _messages(tenant.job(status.id)) if m.startswith("data warning:")]
        assert warnings and all(bad in m for m in warnings)
        logged = [line for _, line in tenant.job(status.id).logs() if " WARNING cantata.worker: data warning:" in line]
        assert logged and all(bad in line for line in logged)  # the worker log has the warning too
    else:
        assert status.state == "FAILED"
        assert "TextEncodingError" in status.reason and bad in status.reason


def _traced_samples(handle) -> dict[int, list[tuple[int, str]]]:
    """worker -> [(step, ids)] in log order, from the ``samples`` lines of a job that traces them."""
    traced = defaultdict(list)
    for worker, line in handle.logs():
        if line.startswith("samples step="):
            step, ids = line.removeprefix("samples step=").split(" ids=")
            traced[worker].append((int(step), ids))
    return traced


def test_a_job_killed_with_its_server_resumes_at_the_exact_next_batch(platform, tenant, local_dataset):
    spec = dict(
        dataset=local_dataset,
        workers=2,
        algorithm="allreduce",
        model="gpt-tiny",
        eval_every=1000,
        checkpoint_every=20,
        batch_size=4,
        seq_len=16,
        trace_samples=True,
    )
    reference = tenant.submit(Job(name="reference", steps=200, **spec))
    assert reference.wait().state == "SUCCEEDED"
    expected = {worker: dict(lines) for worker, lines in _traced_samples(reference).items()}
    assert expected[0][1] != expected[1][1]  # the two ranks read different windows

    handle = tenant.submit(Job(name="interrupted", steps=1500, **spec))
    wait_for(lambda: any(c.step >= 20 for c in tenant.checkpoints(handle.id)), timeout=JOB_TIMEOUT_S)
    platform.kill()  # and the machine's workers with it: the restarted server finds them dead
    for pid in _pids_of(handle.id):
        os.killpg(pid, signal.SIGKILL)
    wait_for(lambda: not _pids_of(handle.id), timeout=JOB_TIMEOUT_S)
    platform.start()
    wait_for(lambda: min(len(lines) for lines in _traced_samples(handle).values()) > 300)
    handle.cancel()
    resumed = [m for m in _messages(handle) if m.startswith("resumed from checkpoint at step")]
    assert resumed, "the job did not resume from a checkpoint"
    resumed_at = int(resumed[0].rsplit(" ", 1)[1])
    assert 20 <= resumed_at < 200

    for worker, lines in _traced_samples(handle).items():
        steps = [step for step, _ in lines]
        assert resumed_at + 1 in steps, f"worker {worker} never trained step {resumed_at + 1}"
        # The second attempt starts at the last step after the checkpoint; the first may have
        # stopped anywhere at or past the checkpoint (exactly at it, nothing is replayed).
        restart = len(steps) - 1 - steps[::-1].index(resumed_at + 1)
        first, second = lines[:restart], lines[restart:]
        assert [s for s, _ in first] == list(range(1, len(first) + 1)) and len(first) >= resumed_at
        assert [s for s, _ in second] == list(range(resumed_at + 1, resumed_at + 1 + len(second)))
        assert second[0][1] == expected[worker][resumed_at + 1]  # exactly the batch after the checkpoint
        assert second[0][1] != expected[worker][1]  # (not from the start of the stream)
        for step, ids in first + [line for line in second if line[0] <= 200]:
            assert ids == expected[worker][step], f"worker {worker} step {step}"


@pytest.fixture(scope="module")
def small_shards(tmp_path_factory) -> Path:
    """40 shards of 1,000 random tokens: at 16 tokens a window, 4 a batch, a rank moves to a new one every ~15 steps."""
    out = tmp_path_factory.mktemp("small-shards")
    rng = np.random.default_rng(0)
    for index in range(40):
        (out / f"shard-{index:05d}.tok").write_bytes(encode_shard(rng.integers(0, 256, 1000), dtype_for("uint16")))
    return out


def _moto_recorder(moto_service, action: str) -> bytes:
    """Drive moto's request recorder (``reset-recording``, ``start-recording``, ``stop-recording``, ``download-recording``)."""
    method = "GET" if action == "download-recording" else "POST"
    with urlopen(
        Request(
            f"{moto_service.endpoint}/moto-api/recorder/{action}", method=method, data=b"" if method == "POST" else None
        ),
        timeout=30,
    ) as reply:
        return reply.read()


def _traced_so_far(platform, job_id: str) -> dict[int, int]:
    """How many ``samples`` lines each worker's log holds now (read in the workspace: the server may be down)."""
    return {
        int(log.stem.split("-")[1]): sum(line.startswith("samples step=") for line in log.read_text().splitlines())
        for log in (platform.paths.jobs / job_id).glob("worker-*.log")
    }


def _objects_of(lines) -> set[int]:
    """The dataset ordinals the traced batches drew from (a sample id is ``object << 32 | window``)."""
    return {int(sample) >> 32 for _, ids in lines for sample in ids.split(",")}


def test_a_gasloc_job_resumes_at_the_exact_next_batch_without_refetching_what_it_read(
    platform, tenant, small_shards, moto_service
):
    platform.stop()
    platform.start("--on-stop", "requeue")  # its stop below stops the job, which resumes once it is back
    dataset = _s3_source(tenant, small_shards, moto_service, "rounds")
    bucket = dataset.split("@", 1)[1].split("/", 1)[0]
    _moto_recorder(moto_service, "reset-recording")
    _moto_recorder(moto_service, "start-recording")
    try:
        handle = tenant.submit(
            Job(
                name="gasloc-resume",
                dataset=dataset,
                algorithm="gasloc",
                workers=2,
                local_steps=5,
                model="gpt-tiny",
                steps=5000,
                eval_every=5000,
                checkpoint_every=40,
                batch_size=4,
                seq_len=16,
                seed=7,
                trace_samples=True,
            )
        )
        wait_for(lambda: any(c.step >= 40 for c in tenant.checkpoints(handle.id)), timeout=JOB_TIMEOUT_S)
        platform.stop()  # stopping its workers: the job resumes from its checkpoint
        wait_for(lambda: not _pids_of(handle.id), timeout=JOB_TIMEOUT_S)
        resumes = _traced_so_far(platform, handle.id)  # where each worker's second attempt begins
        platform.start()
        wait_for(lambda: all(n > resumes[w] + 20 for w, n in _traced_so_far(platform, handle.id).items()))
    finally:
        _moto_recorder(moto_service, "stop-recording")
    recorded = [json.loads(line) for line in _moto_recorder(moto_service, "download-recording").splitlines() if line]
    fetches = Counter(urlsplit(r["url"]).path for r in recorded if r["method"] == "GET")

    # A worker restarted later jumps to the job's round: it seeks to the first batch of that round.
    victim = next(pid for pid in _pids_of(handle.id) if _worker_of(pid) == 1)
    os.kill(victim, 9)
    wait_for(lambda: victim not in _pids_of(handle.id), timeout=JOB_TIMEOUT_S)
    rejoins = _traced_so_far(platform, handle.id)[1]
    rejoined = wait_for(
        lambda: [m for m in (e.message for e in _events_so_far(handle)) if m.startswith("worker 1 rejoins at round")],
        timeout=JOB_TIMEOUT_S,
    )
    wait_for(lambda: _traced_so_far(platform, handle.id)[1] > rejoins, timeout=JOB_TIMEOUT_S)
    handle.cancel()
    handle.wait()
    resumed = [m for m in _messages(handle) if m.startswith("resumed from checkpoint at step")]
    assert resumed, "the job did not resume from a checkpoint"
    resumed_at = int(resumed[0].rsplit(" ", 1)[1])
    assert resumed_at >= 40 and resumed_at % 40 == 0
    rejoin_round = int(re.match(r"worker 1 rejoins at round (\d+)", rejoined[0]).group(1))

    credentials = SourceCredentials(
        "rounds", "s3", moto_service.endpoint, {"access_key_id": MOTO_ACCESS_KEY, "secret_access_key": MOTO_SECRET}
    )
    source = open_dataset(dataset, credentials=credentials)
    keys = [f"/{bucket}/python/{obj.key}" for obj in source.objects]
    for worker, lines in _traced_samples(handle).items():
        with DataLoader(source, batch_size=4, seq_len=16, seed=7, rank=worker, world=2) as loader:
            expected = {
                step: ",".join(map(str, loader.next_batch().sample_ids.tolist()))
                for step in range(1, max(step for step, _ in lines) + 1)
            }
        assert all(ids == expected[step] for step, ids in lines), f"worker {worker}"
        first, second = lines[: resumes[worker]], lines[resumes[worker] :]
        assert second[0] == (resumed_at + 1, expected[resumed_at + 1])  # the exact batch after the checkpoint
        if worker == 1:  # restarted later, it jumped to the job's round: that round's first batch
            assert lines[rejoins] == (rejoin_round * 5 + 1, expected[rejoin_round * 5 + 1])

        read_before = _objects_of(line for line in first if line[0] < resumed_at)
        still_open = _objects_of(line for line in first + second if line[0] >= resumed_at)
        finished = read_before - still_open
        assert len(finished) >= 2
        assert {keys[o]: fetches[keys[o]] for o in finished} == {keys[o]: 1 for o in finished}  # never fetched again
