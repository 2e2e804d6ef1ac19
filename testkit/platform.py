"""A real Cantata server for tests: its own data dir, CANTATA_HOME and port, over TLS on loopback."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cantata.sdk import enroll
from cantata.sdk.client import Client
from cantata.server.config import DataDir
from cantata.server.workers.launcher import worker_pids


def free_port() -> int:
    """A loopback port that is free now (see :func:`free_ports`)."""
    return free_ports(1)


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive loopback ports that are free now, below the kernel's ephemeral range
    (32768 and up), so that no connection of another process is handed one of them while the test runs."""
    candidates = list(range(20000, 32768 - count, count))
    random.shuffle(candidates)
    for base in candidates:
        with contextlib.ExitStack() as held:
            try:
                for port in range(base, base + count):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
        return base
    raise RuntimeError(f"no {count} consecutive free ports below 32768")


def cli(*args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run the real ``cantata`` CLI in a subprocess (the test's timeout bounds it)."""
    result = subprocess.run([sys.executable, "-m", "cantata.sdk.cli", *args], capture_output=True, text=True, env=env)
    if check and result.returncode != 0:
        raise AssertionError(
            f"cantata {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return result


def complete(line: str, out: Path, env: dict | None = None) -> list[str]:
    """What argcomplete offers for ``line``, as the shell's hook asks the real CLI."""
    hook = {
        **(env or os.environ),
        "_ARGCOMPLETE": "1",
        "_ARGCOMPLETE_IFS": "\n",
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
        "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
    }
    subprocess.run([sys.executable, "-m", "cantata.sdk.cli"], env=hook, check=False, capture_output=True)
    return [word.strip() for word in out.read_text().split("\n") if word.strip()]


# Every test client calls from 127.0.0.1, so the per-address enrollment limits would be shared by the
# whole module: tests of other things get room; tests of the limits set their own (``settings``).
LOOPBACK_ENROLLMENT = {"enroll_max_pending_per_address": 1000, "enroll_burst": 1000, "enroll_rate_per_minute": 6000.0}


def passable(path: Path) -> Path:
    """Let other users pass through ``path`` and its parents up to the temp dir (pytest makes them 0700).

    As root the server runs each job's workers as a uid of their own; like an operator's
    data directory, the test's must be reachable by them (docs/operations.md).
    """
    path.mkdir(parents=True, exist_ok=True)
    top = Path(tempfile.gettempdir())
    for folder in [path, *path.parents]:
        if folder == top or top not in folder.parents:
            break
        folder.chmod(folder.stat().st_mode | 0o111)
    return path


def readable(path: Path) -> Path:
    """``passable``, and let other users read the tree under ``path`` (a test's dataset)."""
    passable(path)
    for folder, _dirs, files in os.walk(path):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)
    return path


def private_ids() -> dict[str, int]:
    """A worker uid range and a tenant gid range of a test server's own, far from any other's.

    As root a server kills every process of a job's uid when the job ends: servers started side by
    side (by tests running at once) must not share uids, nor gids (the host's registry refuses that).
    """
    base = random.randrange(1_000, 2_000_000) * 1000
    return {"worker_uid_base": base, "worker_uid_count": 500, "tenant_gid_base": base + 500, "tenant_gid_count": 500}


class Platform:
    """Owns one server process; can stop it gracefully, kill it and restart it.

    ``settings`` override fields of the ``server.json`` that ``server init`` wrote; ``listen_host`` is
    the address it listens on (clients on this machine still reach it on loopback); ``init`` adds
    ``server init`` flags.
    """

    def __init__(
        self,
        root: Path,
        env: dict | None = None,
        settings: dict | None = None,
        host: str = "127.0.0.1",
        *,
        listen_host: str = "127.0.0.1",
        init: tuple[str, ...] = (),
    ):
        self.root = passable(root)
        self.data_dir = root / "data"
        self.home = root / "home"
        self.paths = DataDir(self.data_dir)
        self.port = free_port()
        self.address = f"{host}:{self.port}"
        self.enroll_address = f"{host}:{free_port()}"
        self.env = {**os.environ, **(env or {}), "CANTATA_HOME": str(self.home)}
        os.environ["CANTATA_HOME"] = str(self.home)
        self.proc: subprocess.Popen | None = None
        cli(
            "server",
            "init",
            "--data-dir",
            str(self.data_dir),
            "--listen",
            self.address.replace("127.0.0.1", listen_host),
            "--enroll-listen",
            self.enroll_address.replace("127.0.0.1", listen_host),
            *init,
            env=self.env,
        )
        self.ca_pem = (self.data_dir / "ca.pem").read_bytes()
        self.shared_root = root / "shared"  # the allowed file:// root: each tenant sees its own folder
        saved = self.paths.load_settings()
        saved.allowed_roots = [str(self.shared_root)]
        self.paths.save_settings(replace(saved, **{**LOOPBACK_ENROLLMENT, **private_ids(), **(settings or {})}))

    def tenant_dir(self, tenant: str, *parts: str) -> Path:
        """A folder of ``tenant``'s under the shared root, for its file:// datasets (make it ``readable``)."""
        folder = self.shared_root.joinpath(tenant, *parts)
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def start(self, *options: str, prefix: tuple[str, ...] = ()) -> None:
        """Start the server (``options``: more ``cantata server start`` flags; ``prefix``: a command it runs
        under, such as ``ip netns exec NS``) and wait until it serves."""
        self.log = open(self.root / "server.log", "ab")  # noqa: SIM115 (the server writes to it until it stops)
        self.proc = subprocess.Popen(
            [
                *prefix,
                *[sys.executable, "-m", "cantata.sdk.cli", "server", "start", "--data-dir", str(self.data_dir)],
                *options,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=self.env,
        )
        self.wait_healthy()

    def wait_healthy(self) -> None:
        """Until the server answers SERVING (the test's timeout bounds it); fails at once if it exited."""
        channel = grpc.secure_channel(self.enroll_address, grpc.ssl_channel_credentials(self.ca_pem))
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            while True:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"server exited: {(self.root / 'server.log').read_text()[-3000:]}")
                try:
                    if (
                        stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                        == health_pb2.HealthCheckResponse.SERVING
                    ):
                        return
                except grpc.RpcError:
                    time.sleep(0.1)
        finally:
            channel.close()

    def stop(self, *, leave_workers: bool = False) -> int:
        """SIGTERM and wait: the graceful path.

        The server leaves running jobs training for the next one (``on_stop: leave``); unless
        ``leave_workers``, their workers are killed once it is gone, so that a test leaves nothing running.
        """
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait()
        self.proc = None
        if not leave_workers:
            self.kill_workers()
        return code

    def kill_workers(self) -> None:
        """SIGKILL every worker process of this server's data directory (with what each started)."""
        for pid in worker_pids(f"{self.paths.jobs}/"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self.proc = None

    def admin(self) -> Client:
        return Client.from_profile("admin")

    def enroll(self, name: str, **quota: int) -> Client:
        """Request, approve and fetch a tenant certificate; returns the tenant's client."""
        status = enroll.request_tenancy(name, self.address, self.ca_pem, self.enroll_address)
        with self.admin() as admin:
            admin.approve_tenant(name, status.fingerprint, **quota)
        enroll.fetch_status(name)
        return Client.from_profile(name)

    def server_log(self) -> str:
        return (self.root / "server.log").read_text(errors="replace")
