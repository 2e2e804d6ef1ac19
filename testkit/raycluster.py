"""A real Ray cluster of three nodes for tests, each in a network namespace of its own (needs root).

A bridge on the host and one veth pair per node give each namespace a private
address (``10.213.N.11`` ...); the host keeps ``10.213.N.1``. The nodes run
with Ray's token authentication and TLS on (node certificates from the test
platform's CA) and fake GPU counts; the control plane runs in the head's
namespace, beside the head node, as a Ray driver. Everything is torn down
afterwards, processes first (``ip netns pids``), then the links and namespaces.

A namespace cannot reach the host's DNS server (the bridge is not routed
out), so each gets a resolver configuration of its own (``/etc/netns/<ns>/
resolv.conf``, which ``ip netns exec`` puts over ``/etc/resolv.conf``) that
names none: a lookup fails at once, as one to a working resolver answers at
once. Without it, every reverse lookup waits out the host's resolver (10 s),
and torch's rendezvous makes two per process (it names the peer's address in
its log): 20 s before an all-reduce group's first step that no real node pays.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from testkit.waiting import wait_for

RAY_PORT = 6379
# this interpreter's Ray (a console script's #! may name another environment's Python, whose nodes import its Cantata)
RAY_CLI = (sys.executable, "-m", "ray.scripts.scripts")
NETNS_ETC = Path("/etc/netns")
RESOLVER = "# a test node: no DNS server (the host's is out of reach); lookups fail at once\n"


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True)


@dataclass
class Node:
    index: int
    netns: str
    ip: str
    host_link: str
    certs: Path

    def run(self, *args: str) -> list[str]:
        """``args`` run inside this node's namespace."""
        return ["ip", "netns", "exec", self.netns, *args]

    def pids(self) -> list[int]:
        return [int(p) for p in sh("ip", "netns", "pids", self.netns, check=False).stdout.split()]


@dataclass
class RayCluster:
    """Three namespaced Ray nodes (node 0 is the head); ``env`` is what a driver or node needs."""

    root: Path
    subnet: int = field(default_factory=lambda: 100 + os.getpid() % 100)
    nodes: list[Node] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    _joining: list[threading.Thread] = field(default_factory=list)

    @property
    def tag(self) -> str:
        return f"cr{os.getpid() % 100000}"

    @property
    def bridge(self) -> str:
        return f"{self.tag}b"

    @property
    def host_ip(self) -> str:
        return f"10.213.{self.subnet}.1"

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def address(self) -> str:
        return f"{self.head.ip}:{RAY_PORT}"

    def build_network(self, count: int = 3) -> None:
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for k in range(count):
            netns, host_link, inner = f"{self.tag}n{k}", f"{self.tag}v{k}", f"{self.tag}i{k}"
            ip = f"10.213.{self.subnet}.{11 + k}"
            sh("ip", "netns", "add", netns)
            (NETNS_ETC / netns).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / netns / "resolv.conf").write_text(RESOLVER)
            sh("ip", "link", "add", host_link, "type", "veth", "peer", "name", inner)
            sh("ip", "link", "set", inner, "netns", netns)
            sh("ip", "link", "set", host_link, "master", self.bridge, "up")
            sh("ip", "-n", netns, "addr", "add", f"{ip}/24", "dev", inner)
            sh("ip", "-n", netns, "link", "set", inner, "up")
            sh("ip", "-n", netns, "link", "set", "lo", "up")
            sh("ip", "-n", netns, "route", "add", "default", "via", self.host_ip)
            self.nodes.append(Node(k, netns, ip, host_link, self.root / f"node{k}"))

    def node_env(self, node: Node) -> dict[str, str]:
        return {
            **self.env,
            "RAY_TLS_SERVER_CERT": str(node.certs / "node.pem"),
            "RAY_TLS_SERVER_KEY": str(node.certs / "node.key"),
            "RAY_TLS_CA_CERT": str(node.certs / "ca.pem"),
        }

    def start(self, token_path: Path, gpus: int = 2, cpus: int = 2) -> None:
        """Start the head in its namespace, and the two other nodes in the background (see :meth:`wait_nodes`)."""
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("RAY_")},
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token_path),
            "RAY_USE_TLS": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        self._ray_start(self.head, ["--head", f"--port={RAY_PORT}", "--include-dashboard=false"], cpus, gpus)
        if self.failures:
            raise RuntimeError("\n".join(self.failures))
        # One after the other (two raylets registering at once on a loaded machine time out more often).
        others = [(node, [f"--address={self.address}"]) for node in self.nodes[1:]]

        def join() -> None:
            for node, where in others:
                self._ray_start(node, where, cpus, gpus)

        joining = threading.Thread(target=join)
        joining.start()
        self._joining = [joining]

    def wait_nodes(self) -> None:
        """Until the other nodes' ``ray start`` returned; raises if one failed."""
        for thread in self._joining:
            thread.join()
        if self.failures:
            raise RuntimeError("\n".join(self.failures))

    def _ray_start(self, node: Node, where: list[str], cpus: int, gpus: int, attempts: int = 3) -> None:
        """``ray start`` in ``node``'s namespace; again from scratch if it timed out (Ray waits 30 s for a
        raylet to register, which a loaded machine can exceed)."""
        for attempt in range(attempts):
            started = subprocess.run(
                node.run(
                    *RAY_CLI,
                    "start",
                    *where,
                    f"--node-ip-address={node.ip}",
                    f"--num-cpus={cpus}",
                    f"--num-gpus={gpus}",
                    "--disable-usage-stats",
                    f"--temp-dir={self.root / f'ray{node.index}-{attempt}'}",
                ),
                env=self.node_env(node),
                capture_output=True,
                text=True,
            )
            if started.returncode == 0:
                return
            self.kill_node(node)
        self.failures.append(f"ray start on node {node.index}:\n{started.stdout[-3000:]}\n{started.stderr[-3000:]}")

    def wait_idle(self) -> None:
        """Until no placement group holds a CPU (Ray removes an ended job's group after the job has ended)."""

        def idle() -> bool:
            status = subprocess.run(
                self.head.run(*RAY_CLI, "status", f"--address={self.address}"),
                env=self.node_env(self.head),
                capture_output=True,
                text=True,
            ).stdout
            used = re.search(r"([0-9.]+)/[0-9.]+ CPU", status)
            return used is not None and float(used.group(1)) == 0.0

        wait_for(idle)

    def kill_node(self, node: Node) -> None:
        """Kill every process of ``node``'s namespace (its raylet and workers): the node is lost."""
        for pid in node.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def teardown(self) -> None:
        for node in self.nodes:
            for _ in range(50):
                pids = node.pids()
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.1)
            sh("ip", "link", "del", node.host_link, check=False)
            sh("ip", "netns", "del", node.netns, check=False)
            shutil.rmtree(NETNS_ETC / node.netns, ignore_errors=True)
        sh("ip", "link", "del", self.bridge, check=False)
        shutil.rmtree(self.root, ignore_errors=True)
