"""Does CUDA start under the address-space cap a CPU worker gets? (Why GPU workers get none.)

``server/jobs/memory.py`` gives a worker of a job with ``gpus_per_worker`` no
``RLIMIT_AS``. This starts CUDA in a fresh process three times: uncapped, and
capped at the process's size once torch is loaded plus 4 GiB and plus 32 GiB,
and prints what each did. Needs a CUDA device:

    python3 benchmarks/gpu_rlimit_check.py

On a lent H200 (torch 2.11): uncapped and at +32 GiB CUDA started at a
virtual size of 17 GiB; at +4 GiB ``cudaGetDeviceCount`` failed with out of
memory.
"""

from __future__ import annotations

import subprocess
import sys

PROBE = r"""
import resource, sys, torch

def virtual_size():
    status = open("/proc/self/status").read()
    return int(status.split("VmSize:")[1].split()[0]) * 1024

cap = int(sys.argv[1])
if cap:
    limit = virtual_size() + cap
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:
    torch.ones(1 << 20, device="cuda")
    torch.cuda.synchronize()
    print(f"cap +{cap >> 20} MiB: CUDA started, virtual size {virtual_size() >> 20} MiB")
except Exception as error:
    print(f"cap +{cap >> 20} MiB: CUDA failed: {type(error).__name__}: {str(error).splitlines()[0][:160]}")
"""


def main() -> None:
    for cap_mib in (0, 4096, 32768):
        probe = subprocess.run(
            [sys.executable, "-c", PROBE, str(cap_mib << 20)], capture_output=True, text=True, timeout=120
        )
        print(probe.stdout.strip() or probe.stderr.strip()[-300:])


if __name__ == "__main__":
    main()
