"""Client profiles: ``$CANTATA_HOME/profiles/<name>/`` (default ``~/.cantata``).

A profile holds ``profile.json`` (the server address, and the enrollment
address: the server's port + 1 unless told otherwise; a scraper's also where
``/metrics`` is served), ``ca.pem``, and once approved ``cert.pem`` and
``key.pem`` (mode 0600).

The profile a command uses: ``--profile``, else ``$CANTATA_PROFILE``, else
the one ``cantata profile use`` chose (``$CANTATA_HOME/default-profile``),
else the command's own default (``admin`` for admin commands).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


def home() -> Path:
    return Path(os.environ.get("CANTATA_HOME") or Path.home() / ".cantata")


def enrollment_address(server: str) -> str:
    """Where a server takes enrollment requests by convention: its port + 1."""
    host, _, port = server.rpartition(":")
    return f"{host}:{int(port) + 1}"


DEFAULT_PROFILE_FILE = "default-profile"


def default_profile(fallback: str) -> str:
    """``$CANTATA_PROFILE``, else the chosen default profile, else ``fallback``."""
    return os.environ.get("CANTATA_PROFILE") or chosen_default_profile() or fallback


def chosen_default_profile() -> str:
    """The profile ``cantata profile use`` chose, or ""."""
    try:
        return (home() / DEFAULT_PROFILE_FILE).read_text().strip()
    except FileNotFoundError:
        return ""


def choose_default_profile(name: str) -> None:
    """Make ``name`` the default profile (``cantata profile use``)."""
    home().mkdir(parents=True, exist_ok=True)
    (home() / DEFAULT_PROFILE_FILE).write_text(name + "\n")


@dataclass(frozen=True)
class Profile:
    name: str
    folder: Path

    @classmethod
    def named(cls, name: str) -> Profile:
        return cls(name, home() / "profiles" / name)

    @property
    def exists(self) -> bool:
        return (self.folder / "profile.json").exists()

    @property
    def server(self) -> str:
        return json.loads((self.folder / "profile.json").read_text())["server"]

    @property
    def enroll_server(self) -> str:
        return json.loads((self.folder / "profile.json").read_text())["enroll_server"]

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def cert(self) -> Path:
        return self.folder / "cert.pem"

    @property
    def key(self) -> Path:
        return self.folder / "key.pem"

    def create(self, server: str, enroll_server: str, ca_pem: bytes, *, metrics_server: str = "") -> None:
        """``metrics_server``: where a scraper's profile reads ``/metrics`` (kept only when given)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder.chmod(0o700)
        settings = {"name": self.name, "server": server, "enroll_server": enroll_server}
        if metrics_server:
            settings["metrics_server"] = metrics_server
        (self.folder / "profile.json").write_text(json.dumps(settings, indent=2) + "\n")
        self.ca.write_bytes(ca_pem)

    def write_key(self, pem: bytes) -> None:
        self.key.touch(mode=0o600, exist_ok=True)
        self.key.chmod(0o600)
        self.key.write_bytes(pem)
