"""A job's uid is its own for its workers' lifetime only, and a tenant's files are its workers' alone (as root).

The pen-test's attacks, replayed against a real root-run server: a process of a
job's uid that escaped its process group (double-forked, ``setsid``) and files it
left in the job's workspace, its checkpoint folder and the scratch places; a
process with exactly another tenant's worker's credentials (uid, gid, groups, read
from that worker's ``/proc/<pid>/status``) listing, reading and renaming what an
ended job left; another tenant reading a tenant's ``file://`` dataset. Each test's
server has worker uids of its own (:func:`testkit.platform.private_ids`): the kills
never reach another server's workers.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from cantata.sdk import errors
from cantata.sdk.job import Job
from cantata.server.workers.id_ranges import IdRangeInUse, register, unregister
from cantata.server.workers.launcher import reclaim_locally
from cantata.server.workers.sandbox import Identities
from cantata.server.workers.uid_reclaim import processes_of
from testkit.platform import Platform, cli, passable
from testkit.waiting import JOB_TIMEOUT_S, wait_for
from tests.test_jobs import _pids_of

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="workers get uids of their own only when the server is root")

LONG = dict(model="gpt-tiny", steps=100_000, eval_every=100_000, checkpoint_every=5, batch_size=2, seq_len=16)
QUICK = dict(model="gpt-tiny", steps=10, batch_size=2, seq_len=16)
SCRATCH = ("/tmp", "/dev/shm", "/var/tmp")


def _credentials(pid: int) -> tuple[int, int, list[int]]:
    """The uid, gid and supplementary groups of process ``pid``."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0]), [int(g) for g in fields["Groups"].split()]


def _as(credentials: tuple[int, int, list[int]], script: str) -> subprocess.CompletedProcess:
    """Run ``script`` in ``/bin/sh`` with exactly these credentials (a worker's own, which may run any code)."""
    uid, gid, groups = credentials
    return subprocess.run(
        ["/bin/sh", "-c", script], user=uid, group=gid, extra_groups=groups, cwd="/", capture_output=True, text=True
    )


def _owned_by(uid: int, top: Path) -> list[str]:
    found = []
    for folder, dirs, files in os.walk(top):
        found += [os.path.join(folder, n) for n in dirs + files if os.lstat(os.path.join(folder, n)).st_uid == uid]
    return found


def _running_worker(client, **fields) -> tuple[str, int]:
    """Submit a job of one worker and wait until it trains; (job id, worker pid)."""
    handle = client.submit(Job(name="probe", **fields))
    wait_for(lambda: client.get(handle.id).state == "RUNNING", timeout=JOB_TIMEOUT_S)
    (pid,) = wait_for(lambda: _pids_of(handle.id), timeout=JOB_TIMEOUT_S)
    return handle.id, pid


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    root = tmp_path_factory.mktemp("uids")
    shared = root / "shared"
    # An admin's mistakes: a root of acme's granted to globex, and a root of globex's where acme's corpus
    # gets bind-mounted (a path the server cannot tell from the text). The system still keeps globex out.
    grants = {"globex": [str(shared / "acme" / "corpus"), str(root / "mirror")]}
    p = Platform(root, settings={"tenant_roots": grants})
    p.start()
    yield p
    if p.proc is not None:
        p.stop()


@pytest.fixture(scope="module")
def acme(platform):
    platform.tenant_dir("acme")  # the server gives it acme's group at acme's first launch
    with platform.enroll("acme") as client:
        yield client


@pytest.fixture(scope="module")
def globex(platform):
    with platform.enroll("globex") as client:
        yield client


@pytest.fixture(scope="module")
def ended(platform, acme):
    """An acme job whose uid left an escaped process and files everywhere it could, then cancelled;
    (job id, its uid, the files planted)."""
    job_id, pid = _running_worker(acme, **LONG)
    uid, gid, groups = _credentials(pid)
    workspace = platform.data_dir / "jobs" / job_id
    checkpoints = platform.data_dir / "checkpoints" / "acme" / job_id
    wait_for(lambda: acme.checkpoints(job_id), timeout=JOB_TIMEOUT_S)
    planted = [workspace / "planted", checkpoints / "planted", *(Path(s) / f"cantata-planted-{uid}" for s in SCRATCH)]
    escaped = _as(
        (uid, gid, groups),
        f"setsid sh -c 'sleep 100000 & exit 0' </dev/null >/dev/null 2>&1 ; for f in {' '.join(map(str, planted))}; do echo x > $f; done",
    )
    assert escaped.returncode == 0, escaped.stderr
    assert all(p.exists() for p in planted)
    wait_for(lambda: len(processes_of(uid)) >= 2)  # the worker, and the escaped sleep in a session of its own
    acme.cancel(job_id)
    wait_for(lambda: acme.get(job_id).state == "CANCELLED", timeout=JOB_TIMEOUT_S)
    return job_id, uid, planted


def test_an_ended_jobs_uid_has_no_process_and_owns_nothing_and_the_next_job_gets_another(platform, acme, ended):
    job_id, uid, planted = ended
    assert acme.get(job_id).state == "CANCELLED"
    assert processes_of(uid) == []  # the escaped, double-forked setsid child too
    assert _owned_by(uid, platform.data_dir) == []
    assert _owned_by(uid, Path("/dev/shm")) == []
    assert [str(p) for p in planted if p.exists()] == [str(p) for p in planted[:2]]  # in the job's folders: kept
    assert all(p.stat().st_uid == 0 for p in planted[:2])
    assert acme.checkpoints(job_id)  # still listed, and the server's to read
    assert not (platform.data_dir / "uids" / f"{uid}.json").exists()  # the lease: given back
    second_id, second = _running_worker(acme, **LONG)
    assert _credentials(second)[0] == uid + 1  # round-robin: not the lowest free uid, which is the first's again
    acme.cancel(second_id)
    wait_for(lambda: acme.get(second_id).state == "CANCELLED", timeout=JOB_TIMEOUT_S)
    assert processes_of(uid + 1) == []


def test_another_tenants_worker_cannot_list_read_or_rename_what_an_ended_job_left(platform, acme, globex, ended):
    job_id, _uid, _ = ended
    workspace = platform.data_dir / "jobs" / job_id
    checkpoints = platform.data_dir / "checkpoints" / "acme" / job_id
    manifest = next(checkpoints.rglob("MANIFEST.sealed"))
    shard = next(p for p in checkpoints.rglob("*") if p.is_file() and p.name != "MANIFEST.sealed")
    probe_id, pid = _running_worker(globex, **LONG)
    try:
        globex_worker = _credentials(pid)
        for script in (
            f"ls {workspace}",
            f"cat {workspace}/worker-0.log",
            f"ls {checkpoints}",
            f"cat {shard}",
            f"mv {manifest} {manifest}.moved",
            f"ls {checkpoints.parent}",
        ):
            tried = _as(globex_worker, script)
            assert tried.returncode != 0 and "Permission denied" in tried.stderr, (script, tried.stderr)
        assert manifest.exists()
    finally:
        globex.cancel(probe_id)
        wait_for(lambda: globex.get(probe_id).state == "CANCELLED", timeout=JOB_TIMEOUT_S)


@pytest.mark.parametrize("clash", ["its uids on the first's uids", "its uids on the first's tenant gids"])
def test_a_second_server_whose_id_ranges_overlap_a_running_ones_refuses_to_start(
    platform, acme, tmp_path, monkeypatch, clash
):
    first = platform.paths.load_settings()
    base = first.worker_uid_base if clash.endswith("uids") else first.tenant_gid_base
    monkeypatch.setenv("CANTATA_HOME", os.environ["CANTATA_HOME"])  # Platform() points it at the second's
    other = Platform(tmp_path / "second", settings={"worker_uid_base": base + 10, "worker_uid_count": 5})
    with pytest.raises(RuntimeError, match="overlap those of the server of"):
        other.start()
    log = other.server_log()
    assert f"those of the server of {platform.data_dir.resolve()}" in log
    assert "give this one other worker_uid_base" in log
    assert acme.submit(Job(name="after-clash", **QUICK)).wait().state == "SUCCEEDED"  # the first one: untouched


def test_init_and_start_refuse_a_data_dir_the_worker_uids_cannot_reach(tmp_path):
    env = {**os.environ, "CANTATA_HOME": str(tmp_path / "profiles")}  # the admin profile init writes: not the module's
    home = passable(tmp_path / "home")
    home.chmod(0o700)  # /root in a container
    init = cli("server", "init", "--data-dir", str(home / "data"), env=env, check=False)
    assert init.returncode == 1 and init.stderr.count("\n") == 1, init.stderr
    assert f"cantata: error: {home} (mode 0700) keeps the workers out" in init.stderr
    assert f"chmod o+x {home}" in init.stderr and not (home / "data").exists()

    home.chmod(0o711)
    cli("server", "init", "--data-dir", str(home / "data"), env=env)
    home.chmod(0o700)
    start = cli("server", "start", "--data-dir", str(home / "data"), env=env, check=False)
    assert start.returncode == 1 and start.stderr.strip().splitlines()[-1].startswith(f"cantata: error: {home} ")
    assert f"chmod o+x {home}" in start.stderr


def test_a_uid_whose_cleanup_fails_is_retired_for_good(tmp_path):
    uid = 64_000 + os.getpid() % 500 * 2
    leases = tmp_path / "uids"
    stuck = tmp_path / "readonly"
    stuck.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(stuck)], check=True)
    try:
        (stuck / "written").write_text("by the job")
        os.chown(stuck / "written", uid, uid)
        subprocess.run(["mount", "-o", "remount,ro", str(stuck)], check=True)
        pool = Identities(uid, 2, leases=leases)
        assert pool.acquire("job-a", folders=(stuck,)) is not None
        assert pool.release("job-a", reclaim_locally) is None  # chown on a read-only file system: it failed
        assert pool.retired() == [uid]
        assert "Read-only file system" in json.loads((leases / f"{uid}.json").read_text())["retired"]
        again = Identities(uid, 2, leases=leases)  # a restarted server
        assert again.retired() == [uid] and again.acquire("job-b").uid == uid + 1
        with pytest.raises(RuntimeError, match="no free worker uid"):
            again.acquire("job-c")  # the retired uid is not among those left
    finally:
        subprocess.run(["umount", str(stuck)], check=True)


def test_a_restarted_server_takes_back_the_uids_an_earlier_one_left_in_use(tmp_path):
    uid = 64_001 + os.getpid() % 500 * 2
    leases = tmp_path / "uids"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    earlier = Identities(uid, 1, leases=leases)
    identity = earlier.acquire("job-a", folders=(workspace,))
    os.chown(workspace, identity.uid, identity.gid)
    left = subprocess.Popen(["/bin/sh", "-c", "setsid sleep 100000 & wait"], user=uid, group=uid, cwd="/")
    wait_for(lambda: len(processes_of(uid)) >= 2)
    later = Identities(uid, 1, leases=leases)  # the earlier server died; its job never came back
    with pytest.raises(RuntimeError, match="no free worker uid"):
        later.acquire("job-b")  # not before it is taken back
    assert later.recover(reclaim_locally) == [uid]
    left.wait()
    assert processes_of(uid) == [] and workspace.stat().st_uid == 0
    assert later.acquire("job-b").uid == uid


def test_a_restarted_server_keeps_the_uid_of_a_job_it_adopts_from_other_nodes(tmp_path):
    # A Ray job's workers run on other nodes: no workspace here names their uid, the lease does.
    uid = 64_001 + os.getpid() % 500 * 2
    leases = tmp_path / "uids"
    earlier = Identities(uid, 2, leases=leases)
    given = earlier.acquire("job-a", "acme")
    later = Identities(uid, 2, leases=leases)
    taken: list[int] = []
    assert later.claim("job-a", None, "acme") == given
    assert later.recover(lambda lease: taken.append(lease.uid) or 0.0) == [] and taken == []
    assert later.identity("job-a") == given and later.acquire("job-b").uid == uid + 1


def test_the_host_registry_lets_one_server_per_id_range_run(tmp_path):
    registry = tmp_path / "ranges.json"
    register(tmp_path / "a", range(70_000, 70_100), range(71_000, 71_100), registry)
    register(tmp_path / "a", range(70_000, 70_100), range(71_000, 71_100), registry)  # a restart: its own
    with pytest.raises(IdRangeInUse, match="overlap"):
        register(tmp_path / "b", range(71_050, 71_150), range(72_000, 72_100), registry)  # uids on a's gids
    register(tmp_path / "b", range(72_000, 72_100), range(73_000, 73_100), registry)
    unregister(tmp_path / "a", registry)
    register(tmp_path / "c", range(70_000, 70_100), range(74_000, 74_100), registry)
    assert [e["data_dir"] for e in json.loads(registry.read_text())] == [str(tmp_path / "b"), str(tmp_path / "c")]


def test_a_tenants_group_readable_dataset_is_its_workers_and_not_another_tenants(platform, acme, globex):
    corpus = platform.tenant_dir("acme", "corpus")
    gid = int(cli("server", "tenant-gid", "--data-dir", str(platform.data_dir), "acme", env=platform.env).stdout)
    (corpus / "a.txt").write_text("acme's private text, for acme's jobs alone. " * 200)
    for path, mode in ((corpus, 0o750), (corpus / "a.txt", 0o640)):
        os.chown(path, 0, gid)
        path.chmod(mode)
    own = acme.submit(Job(name="own-data", dataset=corpus.as_uri(), **QUICK))
    assert own.wait().state == "SUCCEEDED"
    # It read them with nothing world-readable: others have no bit on acme's folder, its corpus or the file.
    assert [p.stat().st_mode & 0o007 for p in (corpus.parent, corpus, corpus / "a.txt")] == [0, 0, 0]

    before = globex.list()
    with pytest.raises(errors.InvalidJob) as refused:  # granted to globex by mistake: still acme's folder
        globex.submit(Job(name="probe", dataset=corpus.as_uri(), **QUICK))
    assert refused.value.field == "dataset"
    assert f"outside your folder of it ({platform.shared_root / 'globex'})" in str(refused.value)
    assert globex.list() == before  # nothing started

    mirror = platform.root / "mirror"
    mirror.mkdir()
    subprocess.run(["mount", "--bind", str(corpus), str(mirror)], check=True)
    try:
        through = globex.submit(Job(name="mirror", dataset=mirror.as_uri(), **QUICK))
        ended = through.wait()
    finally:
        subprocess.run(["umount", str(mirror)], check=True)
    assert ended.state == "FAILED"
    assert f"DatasetAccessError: dataset {mirror.as_uri()}: this job's workers may not read {mirror}" in ended.reason
    assert "not restarted: the error is permanent" in ended.reason
