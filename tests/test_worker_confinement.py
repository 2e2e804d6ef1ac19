"""A worker cannot reach other processes, the mount table, the namespaces or its privileges, nor fork without end.

Checked against a real root-run server: its allreduce job's running workers
have ``NoNewPrivs`` 1, ``Seccomp`` 2, ``RLIMIT_NPROC`` = processes x
(threads + ``worker_task_allowance``) and a ``/proc`` of their own mounted
``hidepid=invisible``, and they train. A probe forked through the same spawn
path (the zygote and :func:`cantata.security.process_sandbox.enter`, with the
request fields the server's policy gives a worker) tries ``ptrace``,
``process_vm_readv``, ``mount``, ``umount2``, ``unshare``, ``setns``,
``keyctl`` and a namespace ``clone``, all refused with ``EPERM``, looks for
the server in ``/proc`` and does not find it, and runs a fork bomb (bounded by
the probe itself) that stops at its task limit while the server's job trains
on. Without libseccomp a worker does not start, saying why, unless the filter
is turned off.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cantata.sdk.job import Job
from cantata.security.process_sandbox import SpawnRequest
from cantata.security.worker_confinement import ConfinementPolicy
from cantata.server.workers.sandbox import Identities, base_environment
from cantata.server.workers.zygote import Zygote
from testkit.platform import Platform, passable
from testkit.waiting import JOB_TIMEOUT_S, wait_for
from tests.test_jobs import _pids_of

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the confinement needs a root server (docs/security.md)"),
    pytest.mark.skipif(os.uname().machine != "x86_64", reason="the probe makes raw x86_64 system calls"),
]

ALLOWANCE = 24  # worker_task_allowance of the test server: a small bound, still enough to train
BOMB_CEILING = 8 * (1 + ALLOWANCE)  # the probe's own bound on its fork bomb, should the task limit not hold
LONG = dict(model="gpt-tiny", steps=100_000, eval_every=100_000, checkpoint_every=100_000, batch_size=2, seq_len=16)

PROBE = """
import ctypes, errno, json, os, resource

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def refused(result):
    return errno.errorcode.get(ctypes.get_errno(), "0") if result == -1 else "allowed"

class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

def tasks_of_my_uid():
    total = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}").st_uid == os.getuid():
                    total += len(os.listdir(f"/proc/{pid}/task"))
            except OSError:
                pass
    return total

def fork_bomb(ceiling):
    children, hold = [], os.pipe()
    stopped = {"errno": "none", "forked": 0, "tasks": 0}
    try:
        while len(children) < ceiling:  # the probe's own bound: a broken limit fails the test, not the machine
            pid = os.fork()
            if pid == 0:
                os.close(hold[1])
                os.read(hold[0], 1)  # until the bomb is over
                os._exit(0)
            children.append(pid)
    except OSError as error:
        stopped = {"errno": errno.errorcode[error.errno], "forked": len(children), "tasks": tasks_of_my_uid()}
    else:
        stopped["forked"] = len(children)
    os.close(hold[1])
    for pid in children:
        os.waitpid(pid, 0)
    return stopped

def namespace_clone():
    CLONE_NEWUSER, SIGCHLD = 0x10000000, 17
    result = libc.syscall(56, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)  # x86_64 clone, no new stack: a fork
    if result == 0:
        os._exit(0)  # the child, had the filter let it through
    return refused(result)

def keyctl():
    KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING = 0, -3
    return refused(libc.syscall(250, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0))  # x86_64 keyctl

def main(argv):
    server, ceiling = int(argv[0]), int(argv[1])
    buffer = ctypes.create_string_buffer(8)
    local, remote = IoVec(ctypes.addressof(buffer), 8), IoVec(0x400000, 8)
    status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
    report = {
        "ptrace": refused(libc.ptrace(16, server, 0, 0)),  # PTRACE_ATTACH
        "process_vm_readv": refused(libc.process_vm_readv(server, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)),
        "mount": refused(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
        "umount2": refused(libc.umount2(b"/proc", 2)),
        "unshare": refused(libc.unshare(0x10000000)),  # CLONE_NEWUSER
        "setns": refused(libc.setns(os.open(f"/proc/self/ns/mnt", os.O_RDONLY), 0)),
        "clone": namespace_clone(),
        "keyctl": keyctl(),
        "no_new_privs": status["NoNewPrivs"].strip(),
        "seccomp": status["Seccomp"].strip(),
        "nproc": list(resource.getrlimit(resource.RLIMIT_NPROC)),
        "server_visible": os.path.exists(f"/proc/{server}"),
        "uids_seen": sorted({os.stat(f"/proc/{p}").st_uid for p in os.listdir("/proc") if p.isdigit()}),
        "uid": os.getuid(),
        "fork_bomb": fork_bomb(ceiling),
    }
    print(json.dumps(report))
    return 0
"""


SECCOMP_GONE = 'raise RuntimeError("libseccomp.so.2: cannot open shared object file")\n'
NO_FILTER = """
def main(argv):
    print(open("/proc/self/status").read())
    return 0
"""


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(tmp_path_factory.mktemp("platform"), settings={"worker_task_allowance": ALLOWANCE})
    p.start()
    yield p
    if p.proc is not None:
        p.stop()


@pytest.fixture(scope="module")
def training(platform):
    """An allreduce job of two workers that has trained a logged step; (client, job id)."""
    with platform.enroll("acme") as client:
        handle = client.submit(Job(name="confined", algorithm="allreduce", workers=2, **LONG))
        try:
            wait_for(lambda: client.get(handle.id).step, timeout=JOB_TIMEOUT_S)  # it trains under its confinement
            yield client, handle.id
        finally:
            client.cancel(handle.id)
            handle.wait()


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def _max_processes(pid: int) -> int:
    line = next(x for x in Path(f"/proc/{pid}/limits").read_text().splitlines() if x.startswith("Max processes"))
    return int(line.split()[2])


def _probe(
    tmp_path: Path, modules: dict[str, str], entry: str, argv: list[str], seccomp: bool
) -> tuple[int | None, str]:
    """Run ``entry`` (of ``modules``, written to an import folder) as a worker of a job of one process of one
    thread, through the zygote and the spawn request the server's policy gives; its exit code and its log."""
    probe_dir = passable(tmp_path) / "probe"
    probe_dir.mkdir()
    for name, source in modules.items():
        (probe_dir / f"{name}.py").write_text(source)
    os.chmod(probe_dir, 0o755)
    workspace = tmp_path / "ws"
    workspace.mkdir(mode=0o700)
    identity = Identities(base=62100, count=4).acquire("probe-job")
    assert identity is not None
    os.chown(workspace, identity.uid, identity.gid)
    fields = ConfinementPolicy(seccomp=seccomp, task_allowance=ALLOWANCE).request_fields(processes=1, threads=1)
    zygote = Zygote(warm=False, env={**base_environment(), "PYTHONPATH": str(probe_dir)})
    try:
        request = SpawnRequest(
            argv=argv,
            entry=entry,
            title="probe",
            env={**base_environment(), "HOME": str(workspace)},
            cwd=str(workspace),
            log=str(tmp_path / "probe.log"),
            uid=identity.uid,
            gid=identity.gid,
            memory_bytes=0,
            **fields,
        )
        pid = zygote.spawn(request)
        code = wait_for(lambda: zygote.returncode(pid) is not None and (zygote.returncode(pid),))[0]
    finally:
        zygote.close()
    return code, (tmp_path / "probe.log").read_text()


def test_a_real_jobs_workers_are_confined_and_train(platform, training):
    _, job_id = training
    pids = wait_for(lambda: len(found := _pids_of(job_id)) == 2 and found, timeout=JOB_TIMEOUT_S)
    config = json.loads((platform.data_dir / "jobs" / job_id / "worker-0.json").read_text())
    for pid in pids:
        status = _status(pid)
        assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2", status
        assert _max_processes(pid) == 2 * (config["threads"] + ALLOWANCE)  # processes x (threads + allowance)
        assert os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
        mounts = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
        proc = [line for line in mounts if line.split()[4] == "/proc"]
        assert "hidepid=invisible" in proc[-1], proc
    assert _max_processes(platform.proc.pid) != _max_processes(pids[0])  # the server keeps its own


def test_a_worker_cannot_trace_mount_unshare_see_the_server_or_fork_past_its_limit(platform, training, tmp_path):
    client, job_id = training
    before = client.get(job_id).step
    code, output = _probe(
        tmp_path,
        {"confinement_probe": PROBE},
        "confinement_probe:main",
        [str(platform.proc.pid), str(BOMB_CEILING)],
        True,
    )
    assert code == 0, output
    report = json.loads(output.strip().splitlines()[-1])
    refused = ("ptrace", "process_vm_readv", "mount", "umount2", "unshare", "setns", "clone", "keyctl")
    assert {name: report[name] for name in refused} == dict.fromkeys(refused, "EPERM"), report
    assert report["no_new_privs"] == "1" and report["seccomp"] == "2"
    limit = 1 + ALLOWANCE  # one process of one thread
    assert report["nproc"] == [limit, limit]
    assert not report["server_visible"] and report["uids_seen"] == [report["uid"]], report
    bomb = report["fork_bomb"]
    assert bomb["errno"] == "EAGAIN" and 1 <= bomb["forked"] < limit and bomb["tasks"] <= limit, bomb
    wait_for(lambda: client.get(job_id).step > before, timeout=JOB_TIMEOUT_S)  # the server and its job go on
    assert client.get(job_id).state == "RUNNING"


def test_without_libseccomp_a_worker_fails_closed_unless_the_filter_is_off(tmp_path):
    # pyseccomp raises RuntimeError at import when libseccomp.so.2 is missing; the probe folder shadows it so
    modules = {"pyseccomp": SECCOMP_GONE, "status_probe": NO_FILTER}
    code, output = _probe(tmp_path / "on", modules, "status_probe:main", [], True)
    assert code != 0 and "SeccompUnavailable" in output and "worker_seccomp: false" in output, output
    assert "NoNewPrivs" not in output  # the entry never ran
    code, output = _probe(tmp_path / "off", modules, "status_probe:main", [], False)
    assert code == 0, output
    status = {key: value.strip() for key, _, value in (line.partition(":") for line in output.splitlines())}
    assert status["Seccomp"] == "0" and status["NoNewPrivs"] == "1", status
