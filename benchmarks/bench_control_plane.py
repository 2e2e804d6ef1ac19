"""The control plane next to the limits of its stack: a bare gRPC echo server and a bare group-commit loop.

Starts a real server (``cantata server start``, no worker slots, so no job
runs) and a bare asyncio gRPC echo server on the same mutual-TLS certificates,
and measures, the two taking turns:

- ``GetJob`` and ``SubmitJob`` at 1 and 16 callers (calls/s, p50 and p99)
  against an echo call;
- watchers held open on one job (the server's memory and threads) and the
  fan-out of one event to all of them, against an echo stream that one call
  wakes;
- durable audit appends at 1, 8 and 32 threads against a minimal
  ``fdatasync`` group-commit loop writing the same number of lines;
- a queue of 10,000 jobs: the idle server's CPU with it and with an empty
  queue (in the first window after start, which includes the scheduler's
  one-time verdict on each job it never saw, and in the next one), and the
  scheduler's look at the queue's head.

    .venv/bin/python benchmarks/bench_control_plane.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc
import harness
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cantata.proto.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc
from cantata.sdk import enroll
from cantata.sdk.client import Client
from cantata.security.audit import Action, AuditLog, init_audit
from cantata.server.config import DataDir
from cantata.server.store import Store

SPEC = common_pb2.JobSpec(
    name="bench", workers=1, ranks_per_worker=1, steps=10, batch_size=4, seq_len=16, eval_every=10
)
TARGETS = {"submit_16": 0.5, "get_job_16": 0.7, "fanout_p99_ms": 200.0, "audit_appends": 0.8}
ECHO = "/bench.Echo/Unary"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(*args: str, env: dict) -> None:
    subprocess.run([sys.executable, "-m", "cantata.sdk.cli", *args], check=True, capture_output=True, env=env)


class Server:
    """A real ``cantata server start`` in its own data dir, with an approved tenant."""

    def __init__(self, root: Path, **settings: object):
        self.root, self.data = root, root / "data"
        self.env = {**os.environ, "CANTATA_HOME": str(root / "home")}
        os.environ["CANTATA_HOME"] = self.env["CANTATA_HOME"]
        self.address, self.enroll_address = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        cli("server", "init", "--data-dir", str(self.data), "--listen", self.address,
            "--enroll-listen", self.enroll_address, env=self.env)  # fmt: skip
        paths = DataDir(self.data)
        config = paths.load_settings()
        for name, value in {"max_workers_on_node": 0, **settings}.items():
            setattr(config, name, value)
        config.default_quota = {"max_concurrent_jobs": 1_000_000, "max_workers_per_job": 8, "max_total_steps": 1000}
        paths.save_settings(config)
        self.ca = (self.data / "ca.pem").read_bytes()
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 (the server writes to it until it stops)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cantata.sdk.cli", "server", "start", "--data-dir", str(self.data)],
            stdout=log, stderr=subprocess.STDOUT, env=self.env,
        )  # fmt: skip
        with grpc.secure_channel(self.enroll_address, grpc.ssl_channel_credentials(self.ca)) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                try:
                    if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                        return
                except grpc.RpcError:
                    time.sleep(0.1)

    def tenant(self, name: str) -> Client:
        status = enroll.request_tenancy(name, self.address, self.ca, self.enroll_address)
        with Client.from_profile("admin") as admin:
            admin.approve_tenant(name, status.fingerprint)
        enroll.fetch_status(name)
        return Client.from_profile(name)

    def credentials(self, name: str) -> grpc.ChannelCredentials:
        profile = self.root / "home" / "profiles" / name
        return grpc.ssl_channel_credentials(
            self.ca, (profile / "key.pem").read_bytes(), (profile / "cert.pem").read_bytes()
        )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait()
            self.proc = None


def proc_status(pid: int) -> dict[str, float]:
    """Resident memory (MiB) and threads of a process."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {"rss_mib": int(fields["VmRSS"].split()[0]) / 1024, "threads": int(fields["Threads"])}


def cpu_seconds(pid: int) -> float:
    parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


# ---- the echo server: the limit of this gRPC stack --------------------------------------------
def serve_echo(data: Path, port: int) -> None:
    """A bare asyncio gRPC server on the control plane's certificates: echo, and a stream one call wakes."""

    async def main() -> None:
        fired = asyncio.Event()
        stamp = [0.0]

        async def unary(request: bytes, context) -> bytes:
            return request

        async def watch(request: bytes, context):
            await context.send_initial_metadata(())
            await fired.wait()
            yield str(stamp[0]).encode()

        async def fire(request: bytes, context) -> bytes:
            stamp[0] = time.time()
            fired.set()
            fired.clear()
            return b""

        server = grpc.aio.server(migration_thread_pool=futures.ThreadPoolExecutor(8))
        server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    "bench.Echo",
                    {
                        "Unary": grpc.unary_unary_rpc_method_handler(unary),
                        "Watch": grpc.unary_stream_rpc_method_handler(watch),
                        "Fire": grpc.unary_unary_rpc_method_handler(fire),
                    },
                )
            ]
        )
        credentials = grpc.ssl_server_credentials(
            [((data / "server.key").read_bytes(), (data / "server.pem").read_bytes())],
            root_certificates=(data / "trust.pem").read_bytes(),
            require_client_auth=True,
        )
        server.add_secure_port(f"127.0.0.1:{port}", credentials)
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


# ---- unary calls ---------------------------------------------------------------------------
def unary_run(call: Callable[[int], object], callers: int, per_caller: int) -> dict[str, float]:
    """``callers`` threads making ``per_caller`` calls each: calls/s and latency percentiles (ms)."""
    latencies: list[float] = []
    lock = threading.Lock()

    def caller(index: int) -> None:
        mine = []
        for i in range(per_caller):
            started = time.perf_counter()
            call(index * per_caller + i)
            mine.append(time.perf_counter() - started)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "calls_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 2),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2),
    }


def unary_cases(server: Server, echo_address: str, quick: bool) -> dict:
    tenant_channel = grpc.secure_channel(server.address, server.credentials("bench"))
    echo_channel = grpc.secure_channel(echo_address, server.credentials("bench"))
    jobs = jobs_pb2_grpc.JobsStub(tenant_channel)
    job_id = jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=SPEC, request_id=uuid.uuid4().hex)).id
    echo = echo_channel.unary_unary(ECHO)
    get = jobs_pb2.GetJobRequest(job_id=job_id)
    payload = get.SerializeToString()
    results: dict[str, dict] = {}
    for callers in (1, 16):
        per_caller = (200 if quick else 600) // callers if callers == 1 else (25 if quick else 80)
        submit_per_caller = (60 if quick else 200) if callers == 1 else (8 if quick else 30)
        cases = {
            "get_job": lambda _, n=per_caller, c=callers: unary_run(lambda i: jobs.GetJob(get), c, n),
            "echo": lambda _, n=per_caller, c=callers: unary_run(lambda i: echo(payload), c, n),
            "submit": lambda _, n=submit_per_caller, c=callers: unary_run(
                lambda i: jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=SPEC, request_id=uuid.uuid4().hex)), c, n
            ),
            "echo_for_submit": lambda _, n=submit_per_caller, c=callers: unary_run(lambda i: echo(payload), c, n),
        }
        samples = harness.interleave(cases, 3, warmup=1)
        results[str(callers)] = {name: _median_run(runs) for name, runs in samples.items()}
    tenant_channel.close()
    echo_channel.close()
    return results


def _median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: round(statistics.median(r[key] for r in runs), 2) for key in runs[0]}


# ---- watchers ------------------------------------------------------------------------------
async def _watch_fanout(
    address: str, credentials: grpc.ChannelCredentials, open_stream, fire, watchers: int, pid: int
) -> dict[str, float]:
    """Open ``watchers`` streams, note the server's memory, fire one event, time its arrival at each."""
    before = proc_status(pid)
    async with grpc.aio.secure_channel(address, credentials) as channel:
        calls = [open_stream(channel) for _ in range(watchers)]
        await asyncio.gather(*(call.initial_metadata() for call in calls))
        held = proc_status(pid)
        arrivals: list[float] = []

        async def last(call) -> None:
            stamp = None
            async for message in call:
                stamp = message
            arrivals.append(time.time() - stamp)

        readers = [asyncio.ensure_future(last(call)) for call in calls]
        await asyncio.sleep(0.5)  # every reader waits on its stream
        await fire(channel)
        await asyncio.gather(*readers)
    arrivals.sort()
    return {
        "watchers": watchers,
        "rss_mib_before": round(before["rss_mib"], 1),
        "rss_mib_held": round(held["rss_mib"], 1),
        "threads_held": held["threads"],
        "fanout_p50_ms": round(arrivals[len(arrivals) // 2] * 1000, 1),
        "fanout_p99_ms": round(arrivals[int(len(arrivals) * 0.99)] * 1000, 1),
    }


def watcher_cases(server: Server, echo_address: str, echo_pid: int, watchers: int, trials: int) -> dict:
    credentials = server.credentials("bench")

    def cantata(_: int) -> dict:
        job_id = _submit(server, credentials)

        def open_stream(channel):
            return jobs_pb2_grpc.JobsStub(channel).WatchJob(jobs_pb2.WatchJobRequest(job_id=job_id, cursor=1))

        async def fire(channel) -> None:
            await jobs_pb2_grpc.JobsStub(channel).CancelJob(jobs_pb2.CancelJobRequest(job_id=job_id))

        def stamp_of(event: jobs_pb2.JobEvent) -> float:
            return event.time.seconds + event.time.nanos / 1e9

        return asyncio.run(
            _watch_fanout(server.address, credentials, _mapped(open_stream, stamp_of), fire, watchers, server.pid)
        )

    def echo(_: int) -> dict:
        def open_stream(channel):
            return channel.unary_stream("/bench.Echo/Watch")(b"")

        async def fire(channel) -> None:
            await channel.unary_unary("/bench.Echo/Fire")(b"")

        return asyncio.run(
            _watch_fanout(echo_address, credentials, _mapped(open_stream, lambda m: float(m)), fire, watchers, echo_pid)
        )

    samples = harness.interleave({"cantata": cantata, "echo": echo}, trials)
    return {name: _median_run(runs) for name, runs in samples.items()}


def _submit(server: Server, credentials: grpc.ChannelCredentials) -> str:
    with grpc.secure_channel(server.address, credentials) as channel:
        request = jobs_pb2.SubmitJobRequest(spec=SPEC, request_id=uuid.uuid4().hex)
        return jobs_pb2_grpc.JobsStub(channel).SubmitJob(request).id


class _Stamped:
    """A stream call whose messages are replaced by their send time (seconds since the epoch)."""

    def __init__(self, call, stamp_of):
        self._call, self._stamp_of = call, stamp_of

    def initial_metadata(self):
        return self._call.initial_metadata()

    async def __aiter__(self):
        async for message in self._call:
            yield self._stamp_of(message)


def _mapped(open_stream, stamp_of):
    return lambda channel: _Stamped(open_stream(channel), stamp_of)


# ---- durable audit appends -----------------------------------------------------------------
class GroupCommitLog:
    """The limit: lines appended under a lock, made durable by one ``fdatasync`` per group of waiters."""

    def __init__(self, path: Path):
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._lock = threading.Lock()
        self._cv = threading.Condition()
        self._written = self._synced = 0
        self._syncing = False

    def append(self, line: bytes) -> None:
        with self._lock:
            os.write(self._fd, line)
            self._written += 1
            mine = self._written
        with self._cv:
            while self._synced < mine:
                if not self._syncing:
                    self._syncing = True
                    break
                self._cv.wait()
            else:
                return
        target = self._written
        os.fdatasync(self._fd)
        with self._cv:
            self._synced, self._syncing = max(self._synced, target), False
            self._cv.notify_all()

    def close(self) -> None:
        os.close(self._fd)


def threaded_appends(append: Callable[[int], None], threads: int, total: int) -> float:
    """Appends per second with ``threads`` threads sharing ``total`` appends."""
    each = total // threads
    workers = [threading.Thread(target=lambda t=t: [append(t * each + i) for i in range(each)]) for t in range(threads)]
    started = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return each * threads / (time.perf_counter() - started)


def audit_cases(work: Path, quick: bool) -> dict:
    init_audit(work / "audit")
    log = AuditLog.open(work / "audit")
    limit = GroupCommitLog(work / "limit.jsonl")
    line = b'{"actor":"spiffe://cantata/tenant/acme","action":"job_submitted","resource":"job-0123456789abcdef"}\n'
    results = {}
    for threads in (1, 8, 32):
        total = (64 if quick else 256) * max(1, threads // 4) if threads > 1 else (64 if quick else 200)
        cases = {
            "audit": lambda _, t=threads, n=total: threaded_appends(
                lambda i: log.append("spiffe://cantata/tenant/acme", Action.JOB_SUBMITTED, resource=f"job-{i}"), t, n
            ),
            "group_commit_limit": lambda _, t=threads, n=total: threaded_appends(lambda i: limit.append(line), t, n),
        }
        samples = harness.medians(harness.interleave(cases, 3, warmup=1))
        results[str(threads)] = {
            "appends": total,
            "audit_per_s": round(samples["audit"]),
            "limit_per_s": round(samples["group_commit_limit"]),
            "ratio": round(samples["audit"] / samples["group_commit_limit"], 2),
        }
    log.close()
    limit.close()
    return results


# ---- a long queue --------------------------------------------------------------------------
def queue_case(work: Path, queued: int, idle_s: float) -> dict:
    """Idle CPU of a server with ``queued`` jobs queued and with none, and the scheduler's look at the head."""
    out = {}
    for label, count in (("empty", 0), ("queued", queued)):
        server = Server(work / f"queue-{label}")
        store = Store(DataDir(server.data).database)
        store.add_tenancy_request("bulk", b"csr", "sha256:bulk")
        store.approve_tenant("bulk", "sha256:bulk", b"cert", common_pb2.Quota(max_concurrent_jobs=queued + 1), "b")
        with store.database.transaction():
            for i in range(count):
                store.submit_job(store.tenant("bulk"), f"r{i}", SPEC)
        looks = []
        for _ in range(20):
            started = time.perf_counter()
            store.queue_head()
            looks.append(time.perf_counter() - started)
        store.close()
        server.start()
        time.sleep(2.0)  # past start-up
        windows = []  # the first includes the scheduler's one-time look at each job it never saw; the second is idle
        for _ in range(2):
            before = cpu_seconds(server.pid)
            time.sleep(idle_s)
            windows.append(cpu_seconds(server.pid) - before)
        out[label] = {
            "queued": count,
            "idle_cpu_percent": round(100 * windows[0] / idle_s, 2),
            "idle_cpu_percent_later": round(100 * windows[1] / idle_s, 2),
            "rss_mib": round(proc_status(server.pid)["rss_mib"], 1),
            "queue_head_ms": round(statistics.median(looks) * 1000, 3),
        }
        server.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls, 200 watchers, 2,000 queued jobs")
    parser.add_argument("--echo-server", nargs=2, metavar=("DATA_DIR", "PORT"), help=argparse.SUPPRESS)
    harness.add_output_argument(parser)
    args = parser.parse_args()
    if args.echo_server:
        serve_echo(Path(args.echo_server[0]), int(args.echo_server[1]))
        return
    watchers = 200 if args.quick else 1000
    work = Path(tempfile.mkdtemp(prefix="bench-control-plane-", dir=os.environ.get("BENCH_DIR")))
    server = Server(work / "main", max_streams_per_principal=watchers + 10)
    echo = None
    try:
        server.start()
        server.tenant("bench").close()
        echo_port = free_port()
        echo = subprocess.Popen([sys.executable, __file__, "--echo-server", str(server.data), str(echo_port)])
        echo_address = f"127.0.0.1:{echo_port}"
        with grpc.secure_channel(echo_address, server.credentials("bench")) as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
        unary = unary_cases(server, echo_address, args.quick)
        watch = watcher_cases(server, echo_address, echo.pid, watchers, 1 if args.quick else 3)
        server.stop()
        audit = audit_cases(work, args.quick)
        queue = queue_case(work, 2_000 if args.quick else 10_000, 3.0 if args.quick else 10.0)
    finally:
        if echo is not None:
            echo.kill()
            echo.wait()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    ratios = {
        "submit_16": round(unary["16"]["submit"]["calls_per_s"] / unary["16"]["echo_for_submit"]["calls_per_s"], 3),
        "get_job_16": round(unary["16"]["get_job"]["calls_per_s"] / unary["16"]["echo"]["calls_per_s"], 3),
        "fanout_p99_ms": watch["cantata"]["fanout_p99_ms"],
        "audit_appends": min(r["ratio"] for k, r in audit.items() if k != "1"),
    }
    report = {"quick": args.quick, "unary": unary, "watchers": watch, "audit": audit, "queue": queue}
    report["targets"] = TARGETS
    report["measured"] = ratios
    path = harness.write_results("control_plane", report, harness.output_dir(args.out, args.quick))
    print(path.read_text())


if __name__ == "__main__":
    main()
