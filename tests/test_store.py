"""The control-plane store keeps what it can and refuses nothing it is told by a worker."""

import math

from cantata.proto.v1 import common_pb2
from cantata.server.store import Store


def test_non_finite_losses_do_not_break_progress(tmp_path):
    store = Store(tmp_path / "state.db")
    store.add_tenancy_request("acme", b"csr", "sha256:x")
    store.approve_tenant("acme", "sha256:x", b"cert", common_pb2.Quota(), "root")
    job, _ = store.submit_job(store.tenant("acme"), "request-0001", common_pb2.JobSpec(name="j", steps=10))
    store.record_progress(job.id, step=5, loss=2.5, val_loss=2.4)
    store.record_progress(job.id, step=10, loss=math.nan, val_loss=math.inf)
    after = store.job(job.id)
    assert (after.step, after.loss, after.val_loss) == (10, 2.5, 2.4)
