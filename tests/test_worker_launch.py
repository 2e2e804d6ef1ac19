"""The worker launch is one typed contract: both executors build a ``WorkerLaunch``, and a worker refuses any other."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cantata.proto import jobfields
from cantata.proto.launch import DataSecrets, LaunchError, WorkerLaunch, WorkerSecrets
from cantata.proto.v1 import common_pb2
from cantata.sdk.job import Job
from cantata.security.pki import CertificateAuthority, Principal
from cantata.server.executors.ray import RayExecutor, _Job
from cantata.server.store import JobRecord
from cantata.server.workers.sandbox import Identities
from testkit.waiting import wait_for

SECRET = "s3cr3t-access-key-value"
SECRETS = WorkerSecrets(
    {"tenant": "acme", "job_id": "job-1", "keys": {"1": "a2V5"}},
    DataSecrets(("/data/acme",), {"name": "corpus", "kind": "s3", "endpoint": "e", "secrets": {"key": SECRET}}),
)


def _launch(**changes) -> WorkerLaunch:
    spec = common_pb2.JobSpec(name="x", steps=10, workers=2, algorithm="allreduce")
    launch = WorkerLaunch(
        job_id="job-1",
        tenant="acme",
        worker=1,
        workers=2,
        attempt=1,
        server="127.0.0.1:1",
        ca="/w/ca.pem",
        cert="/w/worker-1.pem",
        key="/w/worker-1.key",
        rendezvous="tcp://127.0.0.1:2",
        threads=1,
        spec=spec,
        secrets=SECRETS,
        fault={"worker": 1, "step": 3},
        store_env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9"},
    )
    return dataclasses.replace(launch, **changes)


def _round_trips(launch: WorkerLaunch) -> None:
    text = launch.to_json()
    assert WorkerLaunch.from_json(text) == launch
    assert WorkerLaunch.from_json(text).to_dict() == json.loads(text)


def test_a_launch_round_trips_and_hides_its_secrets():
    launch = _launch()
    _round_trips(launch)
    raw = json.loads(launch.to_json())
    assert raw["checkpoint_keys"] == SECRETS.checkpoint_keys and raw["data"]["roots"] == ["/data/acme"]
    assert SECRET not in repr(launch) and SECRET not in repr(SECRETS) and "a2V5" not in repr(launch)


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        (lambda raw: raw.update(wokers=raw.pop("workers")), "wokers", "did you mean 'workers'?"),
        (lambda raw: raw.pop("rendezvous"), "rendezvous", "lacks field 'rendezvous'"),
        (lambda raw: raw["data"].update(credentail=None), "data.credentail", "did you mean 'credentials'?"),
        (lambda raw: raw["data"].pop("roots"), "data.roots", "lacks field 'data.roots'"),
        (lambda raw: raw.update(worker="1"), "worker", "worker is str, not int"),
        (lambda raw: raw.update(threads=True), "threads", "threads is bool, not int"),
        (lambda raw: raw["spec"].update(wokers=2), "spec", "spec"),
        (lambda raw: raw["store_env"].update(AWS_REGION=1), "store_env.AWS_REGION", "is int, not str"),
    ],
)
def test_a_launch_with_an_unknown_missing_or_mistyped_field_is_refused_naming_it(change, field, message):
    raw = json.loads(_launch().to_json())
    change(raw)
    with pytest.raises(LaunchError, match=message) as refused:
        WorkerLaunch.from_dict(raw)
    assert refused.value.field == field


def test_a_worker_given_a_misspelt_launch_refuses_to_start_saying_which_field(tmp_path):
    raw = json.loads(_launch().to_json())
    raw["wokers"] = raw.pop("workers")
    config = tmp_path / "worker-1.json"
    config.write_text(json.dumps(raw))
    done = subprocess.run(
        [sys.executable, "-m", "cantata.trainer.worker", "--config", str(config), "--job", "job-1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "LaunchError: unknown field 'wokers' in a worker launch (did you mean 'workers'?)" in done.stderr


def test_the_ray_executor_builds_a_worker_launch_for_the_node_it_placed_the_worker_on(tmp_path):
    ca = CertificateAuthority.create("test CA")
    recorded: list[str] = []

    class Registry:  # the store's certificate registry: only the record of what was minted matters here
        def record_certificate(self, serial: int, principal: str, not_after: dt.datetime) -> None:
            recorded.append(principal)

    executor = RayExecutor(
        "unused:6379",  # no cluster: the plan is made before the node's host is called
        tmp_path / "jobs",
        ca,
        lambda node_ip: f"{node_ip}:7000",
        dt.timedelta(hours=1),
        secrets=None,  # the secrets come as an argument
        certificates=Registry(),
        grace=1.0,
        identities=Identities(60000, 1, root=False),
        memory_limit=lambda job: 0,
    )
    executor._server = "10.0.0.5:7000"
    spec = common_pb2.JobSpec(name="x", steps=10, workers=2, algorithm="allreduce", checkpoint_store="file:///ckpt")
    jobfields.fill_defaults(spec)  # as the server stores it
    job = JobRecord("job-1", "acme", "r" * 8, spec, common_pb2.STARTING, "", 0, 0.0, 0.0, 1, "", "")
    executor._runs[job.id] = _Job(None, rendezvous=["tcp://10.0.0.7:29500"], fault={"worker": 1})
    node = {"node_id": "n", "ip": "10.0.0.7", "folder": "/node/jobs/job-1/worker-1", "gpus": ["0"], "port": 0}

    plan, files = executor._plan_on(job, 1, node, SECRETS, None)
    launch = WorkerLaunch.from_json(files["worker.json"])
    assert type(launch) is WorkerLaunch and launch == plan.launch
    _round_trips(launch)
    assert (launch.worker, launch.server, launch.gossip_host) == (1, "10.0.0.5:7000", "10.0.0.7")
    assert (launch.cert, launch.rendezvous, launch.fault) == (
        "/node/jobs/job-1/worker-1/worker.pem",
        "tcp://10.0.0.7:29500",
        {"worker": 1},
    )
    assert launch.secrets == SECRETS and launch.spec == spec
    assert plan.request.env["CUDA_VISIBLE_DEVICES"] == "0" and plan.request.argv[1] == plan.request.cwd + "/worker.json"
    assert sorted(files) == ["ca.pem", "worker.json", "worker.key", "worker.pem"]
    assert recorded == [Principal.worker("job-1", 1).uri]


def test_the_local_executor_writes_a_worker_launch_that_round_trips(platform, tenant):
    handle = tenant.submit(Job(name="launched", steps=100_000, eval_every=50_000, checkpoint_every=50_000))
    config = platform.paths.jobs / handle.id / "worker-0.json"
    wait_for(lambda: handle.status().state == "RUNNING")  # its launch was written before it started
    launch = WorkerLaunch.load(config)
    handle.cancel()
    assert type(launch) is WorkerLaunch
    _round_trips(launch)
    assert (launch.job_id, launch.worker, launch.spec.name, launch.gossip_host) == (
        handle.id,
        0,
        "launched",
        "127.0.0.1",
    )
    assert Path(launch.cert) == config.with_suffix(".pem") and config.stat().st_mode & 0o777 == 0o600
    assert handle.wait().state == "CANCELLED"
