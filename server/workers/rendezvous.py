"""Where the processes of one ``torch.distributed`` group meet: a file in their job's 0700 workspace.

torch's TCP store answers anyone who can reach its port, with no
authentication: a process of another user on the node could set, read or add
its keys (and so break or steer the group's rendezvous). A ``file://``
rendezvous (torch's ``FileStore``) is a file in the job's workspace, which
only the job's uid (or, when the server is not root, the server's user) can
pass to, so only the group's own processes can touch it. Each group start
gets a file of its own name: a file a crashed group left (its keys stale) is
never joined again.
"""

from __future__ import annotations

import secrets
from pathlib import Path

PREFIX = "rendezvous-"


def file_rendezvous(folder: Path, group: int) -> str:
    """A fresh ``file://`` rendezvous for torch.distributed group ``group``, in ``folder`` (the job's workspace)."""
    return f"file://{folder / f'{PREFIX}{group}-{secrets.token_hex(8)}'}"


def remove_rendezvous_files(folder: Path) -> None:
    """Delete the rendezvous files of groups that ended in ``folder`` (torch removes those of a clean end itself)."""
    for path in folder.glob(f"{PREFIX}*"):
        path.unlink(missing_ok=True)
