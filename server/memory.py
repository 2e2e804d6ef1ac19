"""What a job's worker needs in memory, checked at submit and enforced while it runs.

Per worker: the interpreter with torch and the training modules loaded
(:data:`LOADED_BYTES`), the model's parameters, gradients and two AdamW
moments (16 bytes a parameter), and activations, which grow with
``batch_size × seq_len`` at a cost per token measured for each byte GPT (peak
RSS of one forward, backward and optimizer step, CPU, torch 2.13: gpt-tiny
13.3 KiB, gpt-small 40.3 KiB) and bounded from the shape for the decoder
family (fp32 activations kept for the backward pass, and the logits). Parameters are counted
from :data:`~cantata.proto.vocabulary.MODEL_SHAPES`, without torch. A job whose workers cannot all fit in the
node's memory is refused at submit; a running worker gets ``RLIMIT_AS`` of
twice its estimate past its loaded size, plus headroom (threads' stacks,
allocator slack), unless ``worker_memory_mib`` sets the limit.
"""

from __future__ import annotations

import os
from pathlib import Path

from cantata.proto.v1 import common_pb2
from cantata.proto.vocabulary import BYTE_GPTS, MODEL_SHAPES, Model

MIB = 1 << 20
LOADED_BYTES = 400 * MIB  # measured 340 MiB RSS: python, torch, the training modules
HEADROOM_BYTES = 1024 * MIB
BYTES_PER_PARAMETER = 16  # fp32 weights, gradients, AdamW's two moments
ACTIVATION_BYTES_PER_TOKEN = {Model.GPT_TINY: 14 * 1024, Model.GPT_SMALL: 41 * 1024}  # measured byte GPTs
CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def parameters(model: Model) -> int:
    """The parameters ``cantata.trainer.model.build_model`` makes (tests/test_worker_memory.py checks they agree)."""
    s = MODEL_SHAPES[model]
    if model in BYTE_GPTS:
        width = int(s["n_embd"])
        norms = (2 * int(s["n_layer"]) + 1) * 2 * width
        return (
            int(s["n_layer"]) * 12 * width * width + (2 * int(s["vocab_size"]) + int(s["block_size"])) * width + norms
        )
    dim, heads = int(s["dim"]), int(s["n_heads"]) * int(s["head_dim"])
    kv = int(s["n_kv_heads"]) * int(s["head_dim"])
    layer = 2 * dim * heads + 2 * dim * kv + 3 * dim * int(s["ffn_dim"]) + 2 * dim
    layer += 2 * int(s["head_dim"]) if s["qk_norm"] else 0
    embeddings = int(s["vocab_size"]) * dim * (1 if s["tie_embeddings"] else 2)
    return int(s["n_layers"]) * layer + embeddings + dim


def activation_bytes_per_token(model: Model) -> int:
    if model in BYTE_GPTS:
        return ACTIVATION_BYTES_PER_TOKEN[model]
    s = MODEL_SHAPES[model]
    per_layer = 16 * int(s["dim"]) + 4 * int(s["ffn_dim"]) + 4 * int(s["n_heads"]) * int(s["head_dim"])
    return 4 * (int(s["n_layers"]) * per_layer + 3 * int(s["vocab_size"]))


def activations(spec: common_pb2.JobSpec) -> int:
    return activation_bytes_per_token(Model(spec.model)) * spec.batch_size * spec.seq_len


def worker_estimate(spec: common_pb2.JobSpec) -> int:
    """Bytes one worker process of a parsed ``spec`` is expected to use at its peak."""
    return LOADED_BYTES + BYTES_PER_PARAMETER * parameters(Model(spec.model)) + activations(spec)


def runtime_budget(spec: common_pb2.JobSpec, override_mib: int) -> int:
    """Bytes a worker may allocate once loaded: ``override_mib`` if set, else twice its estimate plus headroom.

    A GPU worker gets no address-space cap (0): CUDA reserves virtual address space for the
    device's memory when it starts, far past any host budget, so ``RLIMIT_AS`` would stop it
    there; its model lives in device memory, which the GPU itself bounds.
    """
    if spec.gpus_per_worker > 0:
        return 0
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
