"""Who a gossip link may talk to: workers of the same job, named by their certificates."""

from __future__ import annotations

from cantata.security.pki import gossip_server_name, principal_from_auth_context

__all__ = ["PeerRefused", "authorize_peer", "gossip_server_name"]


class PeerRefused(PermissionError):
    """The caller is not another worker of this job; ``principal`` is the URI its certificate names ("" if none)."""

    def __init__(self, reason: str, principal: str = ""):
        super().__init__(reason)
        self.principal = principal


def authorize_peer(auth_context: dict, job_id: str, own_index: int) -> int:
    """The verified caller's worker index, if it is another worker of ``job_id``; else ``PeerRefused``."""
    principal = principal_from_auth_context(auth_context)
    if principal is None:
        raise PeerRefused("no verified client certificate")
    if principal.role != "worker" or principal.job_id != job_id or principal.index is None:
        raise PeerRefused(f"{principal.uri} is not a worker of job {job_id}", principal.uri)
    if principal.index == own_index:
        raise PeerRefused(f"{principal.uri} is this worker itself", principal.uri)
    return principal.index
