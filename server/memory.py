"""What a job's worker needs in memory, checked at submit and enforced while it runs.

Per worker: the interpreter with torch and the training modules loaded
(:data:`LOADED_BYTES`), the model's parameters, gradients and two AdamW
moments (16 bytes a parameter), and activations, which grow with
``batch_size × seq_len`` at a cost per token measured for each model (peak
RSS of one forward, backward and optimizer step, CPU, torch 2.13: gpt-tiny
13.3 KiB, gpt-small 40.3 KiB). A job whose workers cannot all fit in the
node's memory is refused at submit; a running worker gets ``RLIMIT_AS`` of
twice its estimate past its loaded size, plus headroom (threads' stacks,
allocator slack), unless ``worker_memory_mib`` sets the limit.
"""

from __future__ import annotations

import os
from pathlib import Path

from cantata.proto.v1 import common_pb2
from cantata.proto.vocabulary import Model

MIB = 1 << 20
LOADED_BYTES = 400 * MIB  # measured 340 MiB RSS: python, torch, the training modules
HEADROOM_BYTES = 1024 * MIB
BYTES_PER_PARAMETER = 16  # fp32 weights, gradients, AdamW's two moments
# (layers, width, context) of cantata.trainer.model.MODELS; tests/test_worker_memory.py checks they agree.
SHAPES = {Model.GPT_TINY: (2, 64, 256), Model.GPT_SMALL: (4, 128, 512)}
ACTIVATION_BYTES_PER_TOKEN = {Model.GPT_TINY: 14 * 1024, Model.GPT_SMALL: 41 * 1024}
VOCABULARY = 256
CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def parameters(model: Model) -> int:
    layers, width, context = SHAPES[model]
    return layers * 12 * width * width + (VOCABULARY + context) * width


def activations(spec: common_pb2.JobSpec) -> int:
    return ACTIVATION_BYTES_PER_TOKEN[Model(spec.model)] * spec.batch_size * spec.seq_len


def worker_estimate(spec: common_pb2.JobSpec) -> int:
    """Bytes one worker process of a parsed ``spec`` is expected to use at its peak."""
    return LOADED_BYTES + BYTES_PER_PARAMETER * parameters(Model(spec.model)) + activations(spec)


def runtime_budget(spec: common_pb2.JobSpec, override_mib: int) -> int:
    """Bytes a worker may allocate once loaded: ``override_mib`` if set, else twice its estimate plus headroom."""
    if override_mib > 0:
        return override_mib * MIB
    return 2 * (worker_estimate(spec) - LOADED_BYTES) + HEADROOM_BYTES


def node_capacity(setting_mib: int) -> int:
    """The node's memory for workers: ``node_memory_mib`` if set, else the machine's (or its cgroup's) memory."""
    if setting_mib > 0:
        return setting_mib * MIB
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total
