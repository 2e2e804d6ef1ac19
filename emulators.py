"""Local S3 (moto server) and Azure Blob (Azurite) services on loopback, for tests and benchmarks.

Plain functions with no pytest in them: ``start_moto`` and ``start_azurite`` start a
service on a free port and wait until it answers; ``stop_service`` stops it. The
pytest fixtures built on them are in ``tests/services.py``. Not part of the
shipped ``cantata`` package.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.error import URLError
from urllib.request import urlopen

REPO_ROOT = Path(__file__).resolve().parent
STARTUP_TIMEOUT_S = 60.0
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
S3_TEST_CREDENTIALS: dict[str, Any] = {
    "aws_access_key_id": "testing",
    "aws_secret_access_key": "testing",
    "region_name": "us-east-1",
}


@dataclass(frozen=True)
class RunningService:
    """A started service: its endpoint and its process."""

    endpoint: str
    process: subprocess.Popen


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_until_ready(process: subprocess.Popen, url: str, name: str) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with code {process.returncode} before becoming ready")
        try:
            urlopen(url, timeout=1).close()  # noqa: S310 (an http URL on loopback, built above)
            return
        except URLError as error:
            if getattr(error, "code", None) is not None:
                return  # an HTTP error status: the server is up and answering
        except (ConnectionError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{name} did not answer at {url} within {STARTUP_TIMEOUT_S:.0f} s")


def _start(command: list[str], url: str, name: str, cwd: Path) -> RunningService:
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_until_ready(process, url, name)
    except BaseException:
        _stop(process)
        raise
    return RunningService(url.rstrip("/"), process)


def stop_service(service: RunningService) -> None:
    """Stop a service (again is fine)."""
    _stop(service.process)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def moto_command(port: int) -> list[str]:
    installed = Path(sys.executable).parent / "moto_server"
    if installed.exists():
        return [str(installed), "-H", "127.0.0.1", "-p", str(port)]
    return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]


def azurite_command(port: int) -> list[str]:
    local = REPO_ROOT / "node_modules" / ".bin" / "azurite-blob"
    executable = str(local) if local.exists() else shutil.which("azurite-blob")
    if executable is None:
        raise RuntimeError("azurite-blob not found: run `make test` (it installs Azurite) or `npm install azurite@3`")
    return [
        executable, "--silent", "--inMemoryPersistence", "--blobHost", "127.0.0.1",
        "--blobPort", str(port), "--skipApiVersionCheck",
    ]  # fmt: skip


def start_moto(workdir: Path) -> RunningService:
    """A moto S3 server (any credentials accepted) on a free loopback port."""
    port = free_port()
    return _start(moto_command(port), f"http://127.0.0.1:{port}/", "moto_server", workdir)


def start_azurite(workdir: Path) -> RunningService:
    """An in-memory Azurite blob service on a free loopback port."""
    port = free_port()
    return _start(azurite_command(port), f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}", "azurite-blob", workdir)


def azurite_connection_string(endpoint: str) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};BlobEndpoint={endpoint};"
    )
