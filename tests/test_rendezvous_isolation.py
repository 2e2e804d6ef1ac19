"""A process of another user cannot touch a running all-reduce job's torch.distributed rendezvous.

Against a real root-run server: an all-reduce job of 2 workers trains, and a
process of another uid, with no certificate, tries what torch's TCP store
would let it do (connect, then set, get and add keys) on every port the job's
workers listen on, and opens the group's rendezvous file. Every try fails,
and the job trains on. A control shows the attack itself works: the same
process sets a key in a TCP store that the test serves.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import select
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch.distributed as dist

from cantata.sdk.job import Job
from testkit.platform import Platform, free_port
from testkit.waiting import JOB_TIMEOUT_S, wait_for
from tests.test_jobs import _pids_of

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="workers run as a uid of their own only under a root server")

ATTACKER_UID = 62990  # no certificate, no job, not the server's
ATTACK_PATIENCE_S = 10  # a TCP store answers at once; the attacker stops waiting for a listener that is none
LONG = dict(algorithm="allreduce", workers=2, model="gpt-tiny", steps=100_000, eval_every=100_000)
LONG |= dict(checkpoint_every=100_000, batch_size=2, seq_len=16)


def _tamper(port: int) -> str:
    """Connect to a TCP store at ``port`` and set, add and get keys; the value read back."""
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=dt.timedelta(seconds=3), wait_for_workers=False)
    store.set("attacker", "x")
    store.add("attacker-count", 1)
    return store.get("attacker").decode()


def _open_file(rendezvous_file: str) -> dict:
    """Open the group's rendezvous file to read and to append, and as a torch FileStore."""
    report = {}
    for mode in ("rb", "ab"):
        try:
            open(rendezvous_file, mode).close()
            report[mode] = "opened"
        except OSError as error:
            report[mode] = f"refused: {error.strerror}"
    try:
        dist.FileStore(rendezvous_file, 2).set("attacker", "x")
        report["FileStore"] = "tampered"
    except Exception as error:
        report["FileStore"] = f"refused: {type(error).__name__}"
    return report


def _as_attacker(attack: Callable[..., object], *args) -> object:
    """``attack(*args)`` in a child forked from this process as ``ATTACKER_UID`` (no groups, no capability)."""
    return _as_attackers(attack, [args])[0]


def _as_attackers(attack: Callable[..., object], tries: list[tuple]) -> list[object]:
    """``attack(*args)`` for each ``args`` of ``tries``, all at once, each in a child forked as ``ATTACKER_UID``.

    A TCP store client waits without end for an answer from a listener that is no store (a gloo
    pair, a TLS endpoint): the attacker gives up after ``ATTACK_PATIENCE_S``, having changed nothing.
    """
    children = []
    for args in tries:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(read)
                os.setgroups([])
                os.setgid(ATTACKER_UID)
                os.setuid(ATTACKER_UID)
                try:
                    result = attack(*args)
                except Exception as error:
                    result = f"refused: {type(error).__name__}"
                os.write(write, json.dumps(result).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        children.append((pid, read))
    patience_ends = time.monotonic() + ATTACK_PATIENCE_S
    results: list[object] = []
    for pid, read in children:
        answered, _, _ = select.select([read], [], [], max(0.0, patience_ends - time.monotonic()))
        if not answered:
            os.kill(pid, signal.SIGKILL)
        with os.fdopen(read) as pipe:
            output = pipe.read()
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        if not answered:
            results.append("refused: no answer")
            continue
        assert code == 0, output
        results.append(json.loads(output))
    return results


def _listening_ports(pids: list[int]) -> list[int]:
    """The TCP ports the processes ``pids`` listen on (their socket inodes in /proc/net/tcp and tcp6)."""
    inodes = set()
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                ports.add(int(fields[1].rpartition(":")[2], 16))
    return sorted(ports)


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(tmp_path_factory.mktemp("platform"))
    p.start()
    yield p
    if p.proc is not None:
        p.stop()


def test_another_uid_without_a_certificate_cannot_set_get_or_add_rendezvous_keys_and_the_job_trains_on(platform):
    with platform.enroll("acme") as client:
        handle = client.submit(Job(name="rendezvous", **LONG))
        try:
            before = wait_for(
                lambda: client.get(handle.id).step, timeout=JOB_TIMEOUT_S
            )  # a step: the group met and trains
            pids = wait_for(lambda: len(found := _pids_of(handle.id)) == 2 and found, timeout=JOB_TIMEOUT_S)
            workspace = platform.data_dir / "jobs" / handle.id
            rendezvous = json.loads((workspace / "worker-0.json").read_text())["rendezvous"]
            assert rendezvous.startswith(f"file://{workspace}/"), rendezvous
            rendezvous_file = rendezvous.removeprefix("file://")
            assert Path(rendezvous_file).is_file()
            assert os.stat(workspace).st_mode & 0o777 == 0o700 and os.stat(workspace).st_uid not in (0, ATTACKER_UID)
            ports = _listening_ports(pids)
            assert ports, "the workers listen on nothing: the attack would prove nothing"

            control_port = free_port()
            control = dist.TCPStore("127.0.0.1", control_port, is_master=True, timeout=dt.timedelta(seconds=30))
            # the attack works on a TCP store: it sets, adds and reads keys in the test's own
            assert _as_attacker(_tamper, control_port) == "x" and control.get("attacker") == b"x"
            tcp = dict(zip(ports, _as_attackers(_tamper, [(port,) for port in ports]), strict=True))
            assert all(str(result).startswith("refused") for result in tcp.values()), tcp
            opened = _as_attacker(_open_file, rendezvous_file)
            assert opened["rb"] == opened["ab"] == "refused: Permission denied", opened
            assert opened["FileStore"].startswith("refused"), opened

            wait_for(lambda: client.get(handle.id).step > before, timeout=JOB_TIMEOUT_S)  # the job trains on
            assert client.get(handle.id).state == "RUNNING"
        finally:
            client.cancel(handle.id)
            handle.wait()
