"""Gossip transport throughput: mTLS gRPC against plaintext gRPC, raw TCP and raw mutual TLS.

Two worker processes on loopback swap a parameter set of S bytes: each sends S
bytes and receives S bytes at once, as a gossip edge does. Measured per
transport and size (best of --trials worker pairs, transports interleaved):
seconds per exchange (best of --repeats after a warm-up),
throughput S / seconds per direction, the ratio against the raw mutual-TLS
socket (Python ``ssl``, same certificates; the encrypted-transport limit here),
CPU seconds (both processes, all threads) per GB moved, which stays meaningful
on a shared machine where wall-clock rates follow the load, and the extra peak
memory of a worker over all exchanges (peak RSS minus RSS with the parameters
already allocated, so it includes the receive buffer) over S. The raw sockets
use one connection per direction and one reused receive buffer; GossipNode
reuses its receive buffers from round to round as well.

    .venv/bin/python benchmarks/bench_gossip_transport.py [--quick]

Writes ``results/bench_gossip_transport.json`` and ``.png`` (``--quick``: a temporary folder, or ``--out``)
(throughput and CPU cost per GB against size, per transport). The full run
covers 64 MiB, 256 MiB and 1 GiB; ``--quick`` stops at 256 MiB.

Targets: mTLS gRPC >= 0.8x raw mTLS; extra peak memory <= 2x S.

Per-link bandwidth caps for experiments: ``GossipNode.set_link_rate(peer,
bytes_per_s)`` (token bucket in the transport). With root, a kernel-level cap
on loopback per (source, destination) address pair works inside ``unshare -n``:

    ip link set lo up
    tc qdisc add dev lo root handle 1: htb default 10
    tc class add dev lo parent 1: classid 1:10 htb rate 100gbit
    tc class add dev lo parent 1: classid 1:20 htb rate 16mbit
    tc filter add dev lo parent 1: protocol ip u32 \\
        match ip src 127.0.0.1/32 match ip dst 127.0.0.2/32 flowid 1:20
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import os
import socket
import ssl
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

import harness

MIB = 1 << 20
TRANSPORTS = ("mtls_grpc", "plaintext_grpc", "raw_tcp", "raw_mtls")
JOB = "bench-job"


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


# --- gRPC endpoints -------------------------------------------------------------------------


def _grpc_node(worker, bundle, secure, chunk_bytes, streams):
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    from cantata.trainer.gossip import GossipNode
    from cantata.trainer.gossip.node import GRPC_OPTIONS
    from cantata.trainer.gossip.service import GossipService, add_gossip_service

    if secure:
        return GossipNode(worker, JOB, bundle, deadline_s=600, chunk_bytes=chunk_bytes, streams=streams)

    class PlaintextService(GossipService):
        def identify(self, context):
            return 1 - self.worker_index  # the only peer in this benchmark

    class PlaintextNode(GossipNode):
        """The same service and client over insecure gRPC: the cost of TLS, measured."""

        def start(self):
            server = grpc.server(ThreadPoolExecutor(max_workers=8), options=GRPC_OPTIONS)
            service = PlaintextService(
                JOB,
                self.worker_index,
                self.mailbox,
                self.deadline_s,
                self.chunk_bytes,
                self._buckets.get,
                self._on_refused,
            )
            add_gossip_service(service, server)
            port = server.add_insecure_port("127.0.0.1:0")
            server.start()
            self._server = server
            self.address = f"127.0.0.1:{port}"
            return self.address

        def _link(self, peer, address):
            with self._lock:
                if address not in self._channels:
                    options = [*GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
                    self._channels[address] = [
                        grpc.insecure_channel(address, options=options) for _ in range(self.streams)
                    ]
                return self._channels[address]

    return PlaintextNode(worker, JOB, bundle, deadline_s=600, chunk_bytes=chunk_bytes, streams=streams)


# --- raw sockets: one connection per direction -----------------------------------------------


def _ssl_contexts(bundle, workdir):
    paths = {}
    for name in ("cert", "key", "ca"):
        path = Path(workdir) / f"{name}-{os.getpid()}.pem"
        path.write_bytes(getattr(bundle, f"{name}_pem"))
        paths[name] = str(path)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    for ctx in (server, client):
        ctx.load_cert_chain(paths["cert"], paths["key"])
        ctx.load_verify_locations(paths["ca"])
        ctx.verify_mode = ssl.CERT_REQUIRED
    client.check_hostname = False
    return server, client


def _send_all(sock, view, chunk):
    for start in range(0, len(view), chunk):
        sock.sendall(view[start : start + chunk])


def _recv_all(sock, view):
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:], min(len(view) - got, 16 * MIB))
        if n == 0:
            raise ConnectionError("peer closed early")
        got += n


class RawLink:
    """Raw TCP or TLS: we listen for the peer's sending connection and dial its listener."""

    def __init__(self, bundle, secure, workdir):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.server_ctx, self.client_ctx = _ssl_contexts(bundle, workdir) if secure else (None, None)

    def connect(self, peer_address):
        host, port = peer_address.rsplit(":", 1)
        accepted = {}
        acceptor = threading.Thread(target=lambda: accepted.setdefault("s", self.listener.accept()[0]))
        acceptor.start()
        out = socket.create_connection((host, int(port)))
        acceptor.join()
        inbound = accepted["s"]
        for s in (out, inbound):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.server_ctx is not None:
            wrapped = {}
            handshake = threading.Thread(
                target=lambda: wrapped.setdefault("s", self.server_ctx.wrap_socket(inbound, server_side=True))
            )
            handshake.start()
            out = self.client_ctx.wrap_socket(out)
            handshake.join()
            inbound = wrapped["s"]
        self.out, self.inbound = out, inbound

    def exchange(self, view, received):
        sender = threading.Thread(target=_send_all, args=(self.out, view, 4 * MIB))
        sender.start()
        _recv_all(self.inbound, received)
        sender.join()


# --- one worker process -------------------------------------------------------------------------


def _worker(worker, transport, size, repeats, chunk_bytes, streams, bundle, conn, barrier, workdir):
    import torch

    torch.set_num_threads(1)
    payload = torch.empty(size // 4, dtype=torch.float32).uniform_()
    view = memoryview(payload.view(torch.uint8).numpy())
    if transport.endswith("grpc"):
        node = _grpc_node(worker, bundle, transport == "mtls_grpc", chunk_bytes, streams)
        conn.send(node.start())
        peers = {1 - worker: conn.recv()}

        def exchange(round):
            got = node.exchange(round, peers, payload)
            if len(got) != 1 or got[1 - worker].numel() != payload.numel():
                raise RuntimeError(f"exchange {round} failed")
    else:
        link = RawLink(bundle, transport == "raw_mtls", workdir)
        conn.send(link.address)
        peer_address = conn.recv()
        barrier.wait()
        link.connect(peer_address)
        received = []  # allocated by the first exchange, as GossipNode does

        def exchange(round):
            if not received:
                received.append(bytearray(size))
            link.exchange(view, memoryview(received[0]))

    barrier.wait()
    rss_before = _rss_bytes()
    _reset_peak_rss()
    exchange(0)  # warm-up: connection set-up and handshakes; receive buffers are allocated here
    times = []
    cpu_before = time.process_time()
    for round in range(1, repeats + 1):
        barrier.wait()
        start = time.perf_counter()
        exchange(round)
        times.append(time.perf_counter() - start)
    conn.send(
        {"times": times, "cpu_s": time.process_time() - cpu_before, "extra_peak_bytes": _peak_rss_bytes() - rss_before}
    )
    barrier.wait()


def measure(transport, size, repeats, chunk_bytes, streams, bundles, workdir):
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    pipes = [ctx.Pipe() for _ in range(2)]
    procs = [
        ctx.Process(
            target=_worker,
            args=(w, transport, size, repeats, chunk_bytes, streams, bundles[w], pipes[w][1], barrier, workdir),
        )
        for w in range(2)
    ]
    for p in procs:
        p.start()
    addresses = [pipes[w][0].recv() for w in range(2)]
    for w in range(2):
        pipes[w][0].send(addresses[1 - w])
    reports = [pipes[w][0].recv() for w in range(2)]
    for p in procs:
        p.join(timeout=60)
    seconds = min(max(a, b) for a, b in zip(reports[0]["times"], reports[1]["times"], strict=True))
    cpu_s = sum(r["cpu_s"] for r in reports) / repeats
    return {
        "transport": transport,
        "size_mib": size // MIB,
        "seconds": seconds,
        "gb_per_s": size / seconds / 1e9,
        "cpu_s_per_gb": cpu_s / (2 * size / 1e9),
        "extra_peak_over_size": max(r["extra_peak_bytes"] for r in reports) / size,
    }


def best_of(trials):
    """One row from several trials of a transport and size: the fastest exchange, the lowest
    CPU cost (the least disturbed by other load on the machine), and the highest peak memory."""
    fastest = min(trials, key=lambda r: r["seconds"])
    return {
        **fastest,
        "trials": len(trials),
        "cpu_s_per_gb": min(r["cpu_s_per_gb"] for r in trials),
        "extra_peak_over_size": max(r["extra_peak_over_size"] for r in trials),
    }


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rate, cost) = plt.subplots(1, 2, figsize=(11, 4))
    for transport in dict.fromkeys(r["transport"] for r in rows):
        mine = [r for r in rows if r["transport"] == transport]
        sizes = [r["size_mib"] for r in mine]
        rate.plot(sizes, [r["gb_per_s"] for r in mine], marker="o", label=transport)
        cost.plot(sizes, [r["cpu_s_per_gb"] for r in mine], marker="o", label=transport)
    for axis, label in ((rate, "GB/s per direction"), (cost, "CPU s per GB moved (both workers)")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("parameter set (MiB)")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    rate.set_yscale("log")
    rate.legend()
    fig.suptitle("Gossip exchange on loopback: mTLS gRPC vs plaintext gRPC, raw TCP, raw mTLS")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 and 256 MiB only")
    parser.add_argument("--repeats", type=int, default=3, help="timed exchanges per worker pair")
    parser.add_argument("--trials", type=int, default=3, help="worker pairs per transport and size")
    parser.add_argument("--chunk-mib", type=int, default=1)
    parser.add_argument("--streams", type=int, default=2, help="gRPC stripes (connections) per link")
    parser.add_argument("--transports", default=",".join(TRANSPORTS))
    harness.add_output_argument(parser)
    args = parser.parse_args(argv)

    from cantata.security.pki import CertificateAuthority, Principal
    from cantata.trainer.gossip import gossip_server_name

    ca = CertificateAuthority.create()
    bundles = [
        ca.issue_bundle(
            Principal.worker(JOB, w), dns_names=[gossip_server_name(JOB, w)], lifetime=timedelta(hours=2), server=True
        )
        for w in range(2)
    ]
    sizes = [64 * MIB, 256 * MIB] if args.quick else [64 * MIB, 256 * MIB, 1024 * MIB]
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for size in sizes:

            def measured(transport: str, trial: int, size: int = size) -> dict:
                row = measure(transport, size, args.repeats, args.chunk_mib * MIB, args.streams, bundles, workdir)
                print(
                    f"{transport:>15} {row['size_mib']:>5} MiB  trial {trial}  {row['seconds']:.3f} s  "
                    f"{row['gb_per_s']:.2f} GB/s  {row['cpu_s_per_gb']:.2f} CPU s/GB  "
                    f"extra peak {row['extra_peak_over_size']:.2f}x",
                    flush=True,
                )
                return row

            # transports interleaved, so a burst of load hits them all alike
            trials = harness.interleave(
                {t: functools.partial(measured, t) for t in args.transports.split(",")}, args.trials
            )
            rows.extend(best_of(done) for done in trials.values())
    for row in rows:
        limit = next((r for r in rows if r["transport"] == "raw_mtls" and r["size_mib"] == row["size_mib"]), None)
        row["ratio_vs_raw_mtls"] = row["gb_per_s"] / limit["gb_per_s"] if limit else None
        row["cpu_efficiency_vs_raw_mtls"] = limit["cpu_s_per_gb"] / row["cpu_s_per_gb"] if limit else None
    print(
        "\n| transport | size MiB | s/exchange | GB/s per direction | vs raw mTLS | CPU s per GB moved "
        "| CPU efficiency vs raw mTLS | extra peak / size |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = f"{r['ratio_vs_raw_mtls']:.2f}x" if r["ratio_vs_raw_mtls"] else "-"
        efficiency = f"{r['cpu_efficiency_vs_raw_mtls']:.2f}x" if r["cpu_efficiency_vs_raw_mtls"] else "-"
        print(
            f"| {r['transport']} | {r['size_mib']} | {r['seconds']:.3f} | {r['gb_per_s']:.2f} | {ratio} "
            f"| {r['cpu_s_per_gb']:.2f} | {efficiency} | {r['extra_peak_over_size']:.2f} |"
        )
    out = harness.output_dir(args.out, args.quick)
    path = harness.write_results(
        "gossip_transport",
        {
            "quick": args.quick,
            "chunk_mib": args.chunk_mib,
            "streams": args.streams,
            "repeats": args.repeats,
            "trials": args.trials,
            "rows": rows,
        },
        out,
    )
    plot(rows, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png').name}")


if __name__ == "__main__":
    sys.exit(main())
