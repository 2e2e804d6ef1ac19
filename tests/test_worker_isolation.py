"""A worker reaches nothing of the server's: not its environment, keys, database, descriptors or other jobs.

Checked from inside real worker processes: a job's worker on a real server
started with ``$CANTATA_MASTER_KEY`` and cloud credentials in its
environment, and a probe forked through the same spawn path (the zygote and
:mod:`cantata.server.workers.sandbox`) as a worker of another job, which tries to
read every secret of the data directory.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from cantata.sdk.job import Job
from cantata.security.process_sandbox import SpawnRequest
from cantata.server.workers.sandbox import Identities, base_environment
from cantata.server.workers.zygote import Zygote
from testkit.platform import Platform
from testkit.waiting import JOB_TIMEOUT_S, wait_for
from tests.test_jobs import _pids_of

ROOT = os.geteuid() == 0
SECRET = "do-not-leak-3f1c"
SERVER_SECRETS = {"AWS_SECRET_ACCESS_KEY": SECRET, "AZURE_STORAGE_CONNECTION_STRING": SECRET, "OTHER_TOKEN": SECRET}
ALLOWED = {
    *("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH", "CANTATA_THIRD_PARTY_LOG_LEVEL"),
    *("PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "MALLOC_ARENA_MAX", "OPENBLAS_NUM_THREADS"),
    *("OMP_NUM_THREADS", "HOME", "TMPDIR"),
}
LONG = dict(model="gpt-tiny", steps=100_000, eval_every=100_000, checkpoint_every=100_000, batch_size=2, seq_len=16)


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    root = tmp_path_factory.mktemp("platform")
    p = Platform(root)
    master_key = (p.data_dir / "master.key").read_text().strip()
    p.env = {**p.env, "CANTATA_MASTER_KEY": master_key, **SERVER_SECRETS}
    p.start()
    yield p
    if p.proc is not None:
        p.stop()


@pytest.fixture(scope="module")
def running(platform):
    """A job of tenant acme whose one worker is training; (job id, worker pid)."""
    with platform.enroll("acme") as client:
        handle = client.submit(Job(name="isolated", **LONG))
        wait_for(lambda: client.get(handle.id).state == "RUNNING", timeout=JOB_TIMEOUT_S)
        (pid,) = wait_for(lambda: _pids_of(handle.id), timeout=JOB_TIMEOUT_S)
        yield handle.id, pid
        client.cancel(handle.id)
        handle.wait()


def _ids(pid: int, field: str) -> list[int]:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith(field + ":"))
    return [int(x) for x in line.split()[1:]]


def test_a_jobs_worker_has_an_allow_listed_environment_its_workspace_and_no_inherited_descriptors(platform, running):
    job_id, pid = running
    # A forked worker's /proc/<pid>/environ is the zygote's start-up environment (partly overwritten by
    # its title): it must hold nothing of the server's. Its live environment is checked by the probe below.
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    assert b"CANTATA_MASTER_KEY" not in raw and SECRET.encode() not in raw and b"AWS_" not in raw, raw
    workspace = platform.data_dir / "jobs" / job_id
    assert os.readlink(f"/proc/{pid}/cwd") == str(workspace)
    # Every descriptor it holds is one it opened: nothing of the server's (its database, log, keys, sockets).
    server_files = {
        os.readlink(f"/proc/{platform.proc.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{platform.proc.pid}/fd")
    }
    held = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    assert not {f for f in held & server_files if not f.startswith(("/dev/", "pipe:", "anon_inode:"))}, held
    assert not any(f.startswith(str(platform.data_dir)) and not f.startswith(str(workspace)) for f in held), held
    if ROOT:
        uid = _ids(pid, "Uid")
        assert uid[0] != 0 and len(set(uid)) == 1, uid
        tenant_gid = json.loads((platform.data_dir / "tenant-gids.json").read_text())["acme"]
        assert _ids(pid, "Groups") == [tenant_gid] and _ids(pid, "Gid") == [uid[0]] * 4  # its tenant's gid, no other
        assert os.stat(workspace).st_uid == uid[0] and os.stat(workspace).st_mode & 0o777 == 0o700


PROBE = """
import json, os, sys
from pathlib import Path

def main(argv):
    data, other = Path(argv[0]), Path(argv[1])
    targets = [data / name for name in ("ca.key", "master.key", "server.key", "state.db", "state.db-wal", "state.db-shm", "server.json", "keyring.sealed")]
    targets += [p for p in (data / "audit").rglob("*")] + [data / "audit" / "keys", data / "audit", data, other]
    targets += [p for p in other.iterdir()] if os.access(other, os.R_OK) else []
    targets += [Path(f"/proc/{argv[2]}/environ"), Path(f"/proc/{argv[2]}/mem")]
    read = []
    for target in targets:
        try:
            if target.is_dir():
                os.listdir(target)
            else:
                target.open("rb").read(1)
            read.append(str(target))
        except OSError:
            pass
    print(json.dumps({
        "read": read, "env": dict(os.environ), "fds": {x: os.readlink(f"/proc/self/fd/{x}") for x in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{x}")},
        "uid": os.getuid(), "groups": os.getgroups(), "cwd": os.getcwd(),
    }))
    return 0
"""


def test_a_worker_of_another_job_reads_no_key_database_audit_key_or_workspace_of_the_server(
    platform, running, tmp_path, monkeypatch
):
    job_id, _ = running
    for name, value in {**SERVER_SECRETS, "CANTATA_MASTER_KEY": "c2VjcmV0"}.items():
        monkeypatch.setenv(name, value)  # the spawn path runs in a process whose environment holds secrets
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    (probe_dir / "probe_entry.py").write_text(PROBE)
    os.chmod(tmp_path, 0o711)
    os.chmod(probe_dir, 0o755)
    leaked_fd = os.open(platform.data_dir / "ca.key", os.O_RDONLY)  # the server holds descriptors: none is passed on
    os.set_inheritable(leaked_fd, True)
    workspace = tmp_path / "ws"
    workspace.mkdir(mode=0o700)
    identity = Identities(base=62000, count=4).acquire("probe-job")
    if identity is not None:
        os.chown(workspace, identity.uid, identity.gid)
    zygote = Zygote(warm=False, env={**base_environment(), "PYTHONPATH": str(probe_dir)})
    try:
        request = SpawnRequest(
            argv=[str(platform.data_dir), str(platform.data_dir / "jobs" / job_id), str(platform.proc.pid)],
            entry="probe_entry:main",
            title="probe",
            env={**base_environment(), "HOME": str(workspace)},
            cwd=str(workspace),
            log=str(tmp_path / "probe.log"),
            uid=identity.uid if identity else None,
            gid=identity.gid if identity else None,
            memory_bytes=0,
        )
        pid = zygote.spawn(request)
        code = wait_for(lambda: zygote.returncode(pid) is not None and (zygote.returncode(pid),))[0]
    finally:
        zygote.close()
        os.close(leaked_fd)
    output = (tmp_path / "probe.log").read_text()
    assert code == 0, output
    report = json.loads(output.strip().splitlines()[-1])
    fds = {int(fd): target for fd, target in report["fds"].items()}
    assert sorted(fds)[:3] == [0, 1, 2] and fds[1] == fds[2] == str(tmp_path / "probe.log") and fds[0] == os.devnull
    # Beyond them: the interpreter's library folders (pinned when other users cannot pass to
    # them, see cantata.security.process_sandbox); nothing of the server's.
    library = (sys.base_prefix, sys.prefix)
    assert all(target.startswith(library) for fd, target in fds.items() if fd > 2), fds
    assert (
        not any(SECRET in v or "c2VjcmV0" in v for v in report["env"].values())
        and "AWS_SECRET_ACCESS_KEY" not in report["env"]
    )
    assert set(report["env"]) <= ALLOWED, sorted(report["env"])
    assert report["cwd"] == str(workspace) and report["env"]["HOME"] == str(workspace)
    if not ROOT:
        pytest.skip("not root: workers run as the server's user (docs/security.md says what still holds)")
    assert report["uid"] == identity.uid and report["groups"] == []
    assert report["read"] == [], report["read"]
