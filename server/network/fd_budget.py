"""File descriptors for the control plane's own use, whatever its listeners are sent.

At start the server raises its soft ``RLIMIT_NOFILE`` to the hard limit and
checks that the connections its listeners may hold in all, plus
``reserved_fds`` for its own files (the database, the audit log, worker
pipes and logs, outgoing connections), fit under it; if they do not it
refuses to start, naming both numbers, rather than run where a flood could
take the descriptors the server needs.
"""

from __future__ import annotations

import resource


class DescriptorBudgetTooSmall(Exception):
    """The connection caps and the reserve do not fit under the hard limit on open files."""


def reserve_descriptors(connections: int, reserved: int) -> int:
    """Raise the soft limit to the hard one; returns it, or raises if ``connections + reserved`` exceed it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    needed = connections + reserved
    if hard != resource.RLIM_INFINITY and needed > hard:
        raise DescriptorBudgetTooSmall(
            f"the listeners may hold {connections} connections and {reserved} descriptors are reserved for the "
            f"server's own files: {needed} in all, past the hard limit of {hard} open files; lower max_connections, "
            "http_max_connections or reserved_fds in server.json, or raise the limit (ulimit -Hn, LimitNOFILE=)"
        )
    return soft
