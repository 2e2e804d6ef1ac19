"""A real platform job on a GPU, side by side with the same job on the CPU, for a GPU machine.

Starts a server (the local executor, which counts the node's GPUs), enrolls a
tenant and trains the same job twice through the SDK, interleaved: once with
``gpus_per_worker=1`` (``cuda``, bf16 autocast, an NCCL group) and once with
``gpus_per_worker=0`` (the CPU, fp32, gloo). It reports each job's submit →
first step (after a warm-up job), its median ``tokens_per_s`` metric and its
final validation loss,
the GPU/CPU ratios, and what the worker's own log says it trained on. The GPU
job's last checkpoint is then downloaded and loaded on the CPU (checkpoints
are device-independent). Writes ``bench_gpu_job.json`` into ``--out``.

    python benchmarks/gpu_job.py --out DIR      # on a machine with a GPU
    python benchmarks/gpu_job.py --check        # no GPU: both jobs on the CPU, few steps (tests the script)

One GPU cannot hold a 2-worker NCCL group (NCCL refuses two ranks on one
device), so this script trains one worker per job; ``--workers`` asks for
more where the node has that many GPUs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test kit's real-server harness

from cantata.sdk.job import Job
from testkit.platform import Platform

JOB = dict(model="gpt-small", dataset="builtin:pystdlib", algorithm="allreduce", batch_size=32, seq_len=256)


def train(client, name: str, gpus: int, workers: int, steps: int) -> dict:
    """Submit one job, wait for it, and return what it measured."""
    start = time.monotonic()
    handle = client.submit(
        Job(name=name, workers=workers, steps=steps, gpus_per_worker=gpus, eval_every=steps, **JOB)  # type: ignore[arg-type]
    )
    first_step = None
    for event in handle.events():
        if first_step is None and event.kind == "PROGRESS":
            first_step = time.monotonic() - start
        if event.kind == "STATE" and event.state in ("FAILED", "CANCELLED", "SUCCEEDED"):
            break
    status = handle.wait()
    wall = time.monotonic() - start
    log = [line for _seq, line in handle.logs()]
    if status.state != "SUCCEEDED":
        raise RuntimeError(f"{name} ended {status.state}: {status.reason}\n" + "\n".join(log[-40:]))
    rates = [row.value for row in handle.metrics(["tokens_per_s"])]
    return {
        "job": handle.id,
        "gpus_per_worker": gpus,
        "submit_to_first_step_s": round(first_step or 0.0, 3),
        "wall_s": round(wall, 2),
        "tokens_per_s_median": round(statistics.median(rates), 1) if rates else None,
        "val_loss": status.val_loss,
        "device_log": [line for line in log if "training on" in line][:2],
    }


def loads_on_cpu(client, job_id: str, folder: Path) -> int:
    """Download the job's latest checkpoint and load it on the CPU; returns its tensor count."""
    path = client.download_checkpoint(job_id, None, folder / f"{job_id}.pt")
    state = torch.load(path, map_location="cpu", weights_only=True)
    tensors = [t for t in state.values() if isinstance(t, torch.Tensor)]
    if not tensors or any(t.device.type != "cpu" for t in tensors):
        raise RuntimeError("the checkpoint did not load on the CPU")
    return len(tensors)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="no GPU needed: both jobs on the CPU, 20 steps")
    parser.add_argument("--steps", type=int, default=400, help="the GPU job's steps")
    parser.add_argument("--cpu-steps", type=int, default=60, help="the CPU job's (its throughput is what compares)")
    parser.add_argument("--workers", type=int, default=1)
    harness.add_output_argument(parser)
    args = parser.parse_args(argv)
    steps, cpu_steps = (20, 20) if args.check else (args.steps, args.cpu_steps)
    gpus = 0 if args.check else 1
    if not args.check and not torch.cuda.is_available():
        raise SystemExit("no GPU here: run with --check")
    with tempfile.TemporaryDirectory(prefix="gpu-job-") as tmp:
        root = Path(tmp)
        platform = Platform(root / "platform", settings={"gpus": gpus * args.workers})
        platform.start()
        try:
            client = platform.enroll("gpu-bench", max_gpus=gpus * args.workers, max_workers_per_job=args.workers)
            with client:
                train(client, "warm-up", 0, 1, 2)  # the server's zygote is warm from here on
                gpu = train(client, "on-gpu", gpus, args.workers, steps)
                cpu = train(client, "on-cpu", 0, args.workers, cpu_steps)
                tensors = loads_on_cpu(client, gpu["job"], root)
        finally:
            platform.stop()

    def ratio(key: str) -> float | None:
        return round(gpu[key] / cpu[key], 2) if gpu[key] and cpu[key] else None

    report = {
        "check": args.check,
        "device": torch.cuda.get_device_name() if gpus else "cpu",
        "torch": torch.__version__,
        "job": {**JOB, "workers": args.workers, "steps": {"gpu": steps, "cpu": cpu_steps}},
        "gpu": gpu,
        "cpu": cpu,
        "tokens_per_s_gpu_over_cpu": ratio("tokens_per_s_median"),
        "first_step_gpu_over_cpu": ratio("submit_to_first_step_s"),
        "gpu_checkpoint_loaded_on_cpu_tensors": tensors,
    }
    path = harness.write_results("gpu_job", report, harness.output_dir(args.out, args.check))
    print(report)
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
