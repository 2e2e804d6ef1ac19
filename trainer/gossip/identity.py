"""Who a gossip link may talk to: workers of the same job, named by their certificates."""

from __future__ import annotations

from cantata.security.pki import Principal, principal_from_auth_context


class PeerRefused(PermissionError):
    """The caller is not another worker of this job."""


def gossip_server_name(job_id: str, worker: int) -> str:
    """The DNS SAN a worker's certificate must carry so its peers can dial it.

    Callers verify the callee's certificate against this name, so parameters
    only ever go to worker ``worker`` of ``job_id``. Issue worker bundles with
    ``dns_names=[gossip_server_name(job_id, n)]`` and ``server=True``.
    """
    return f"worker-{worker}.{job_id.lower()}.gossip.cantata"


def authorize_peer(auth_context: dict, job_id: str, own_index: int) -> Principal:
    """The verified caller, if it is another worker of ``job_id``; else ``PeerRefused``."""
    principal = principal_from_auth_context(auth_context)
    if principal is None:
        raise PeerRefused("no verified client certificate")
    if principal.role != "worker" or principal.job_id != job_id:
        raise PeerRefused(f"{principal.uri} is not a worker of job {job_id}")
    if principal.index == own_index:
        raise PeerRefused(f"{principal.uri} is this worker itself")
    return principal
