"""Every job field, typed, with the SDK's default: the fields of ``cantata.sdk.Job``.

Generated from :mod:`cantata.proto.jobfields` by ``python -m cantata.proto.codegen``; do not edit.
"""

from __future__ import annotations

import dataclasses
import uuid


def _request_id() -> str:
    return uuid.uuid4().hex


@dataclasses.dataclass
class JobFields:
    """The fields of ``docs/job-fields.md``, then ``request_id`` (makes ``submit`` idempotent)."""

    name: str
    "the job's name, shown in listings"
    model: str = "gpt-tiny"
    "model configuration"
    dataset: str = "builtin:pystdlib"
    "builtin:pystdlib, file:///DIR under an allowed root, s3://SOURCE@bucket/prefix or az://SOURCE@container/prefix"
    algorithm: str = ""
    "how the workers train together"
    workers: int = 1
    "worker processes; for gasloc and diloco, worker groups"
    topology: str = ""
    "the gossip graph (diloco: always complete)"
    local_steps: int = 0
    "inner steps H between gossip rounds"
    optimizer: str = "adamw"
    "inner optimizer"
    steps: int = 300
    "training steps"
    checkpoint_every: int = 0
    "steps between encrypted checkpoints"
    checkpoint_store: str = ""
    "file:///DIR under an allowed root, s3://bucket/prefix or az://container/prefix"
    eval_every: int = 0
    "steps between validation losses"
    batch_size: int = 0
    "sequences per step and worker"
    seq_len: int = 0
    "tokens per sequence"
    lr: float = 0.0
    "inner learning rate"
    seed: int = 0
    "random seed of initialization and data order"
    outer_lr: float | None = None
    "outer step eta"
    outer_momentum: float | None = None
    "outer momentum gamma; 0 is plain gossip"
    gossip_step: float | None = None
    "gasloc mixing step alpha (diloco mixes with 1/workers)"
    compression: str = ""
    "encoding of gossiped updates"
    trace_samples: bool = False
    "log every step's sample ids (data lineage; makes the logs large)"
    on_bad_utf8: str = ""
    "dataset text that is not UTF-8: skip it with a warning event, or fail the job"
    ranks_per_worker: int = 0
    "gasloc/diloco: processes per worker group, data parallel inside; single and allreduce jobs must leave it 1"
    min_workers: int = 0
    "quorum: the job fails when fewer worker groups are alive"
    max_failures: int | None = None
    "worker failures survived by restarting from the latest checkpoint (gasloc/diloco: restarts per worker); the server's max_worker_restarts bounds it"
    tags: tuple[str, ...] | list[str] = ()
    "labels to find the job by (`cantata jobs list --tag`)"
    round_deadline_s: float | None = None
    "seconds a gossip round or diloco all-reduce may take before a late peer's edge is dropped"
    round_time_s: float | None = None
    "time budget of each round's inner steps, seconds: each worker runs as many as fit (at least 1), weighted by steps done in the outer step"
    warmup_steps: int | None = None
    "steps of linear learning-rate warm-up from 0; 0 is none"
    lr_schedule: str = ""
    "decay of the learning rate after warm-up, to min_lr_ratio x lr at the last step"
    min_lr_ratio: float | None = None
    "the decay's floor, as a fraction of lr"
    weight_decay: float | None = None
    "decoupled weight decay of weight matrices (norms and biases never decay)"
    grad_clip: float = 0.0
    "clip the global gradient norm (after averaging across workers) to this; unset: no clipping"
    grad_accum: int = 0
    "micro-batches of batch_size accumulated per optimizer step"
    eval_batches: int = 0
    "validation batches of batch_size per evaluation (the dataset's validation split must hold them)"
    keep_last: int = 0
    "checkpoints kept in the store; older ones are deleted once a newer one is written"
    async_checkpoint: bool = False
    "upload checkpoints in the background: training goes on after a copy of the state to host memory (which needs room for one more copy of the model and optimizer), and the checkpoint exists once every object is stored"
    tokenizer: str = ""
    "sha256:HEX of the tokenizer.json the dataset was prepared with (`cantata data prepare --tokenizer` prints it); every shard must record it"
    tokenizer_vocab: int = 0
    "the tokenizer's vocabulary size (with tokenizer); at most the model's vocabulary"
    dp_shard: int = 0
    "ranks each parameter, gradient and optimizer state is sharded over (FSDP2); decoder models. gasloc/diloco: equal to ranks_per_worker, each worker group is sharded and every rank gossips its shard"
    tp: int = 0
    "tensor-parallel ranks (column/row-parallel attention and MLP); must divide the key/value heads"
    dp_replicate: int = 0
    "replicas of the sharded model (HSDP: sharded inside a replica, averaged across)"
    activation_checkpointing: bool = False
    "recompute each decoder layer in the backward pass"
    mixed_precision: str = ""
    "compute dtype of a sharded model (gradients are reduced in fp32)"
    init_from: str = ""
    "initial weights: a .safetensors file or object, or a directory or prefix of them (Hugging Face names; a Llama/Qwen3 folder's config.json must be the job's model): file:///PATH under an allowed root, s3://SOURCE@bucket/prefix or az://SOURCE@container/prefix through one of your data sources; loaded one at a time, each rank keeping its shard"
    canzona_alpha: float | None = None
    "Canzona's balance of its ownership plan: 1 balances Newton-Schulz compute across ranks, 0 communication"
    canzona_bucket_elements: int = 0
    "elements per gradient bucket of Canzona's plan (parameters are never split)"
    canzona_cost_unit: str = ""
    "how Canzona weighs a matrix: Newton-Schulz FLOPs, or elements as the authors' code does"
    muon_momentum: float | None = None
    "Muon's (Nesterov) momentum"
    muon_ns_steps: int = 0
    "Newton-Schulz iterations per update"
    muon_ns_dtype: str = ""
    "precision of the Newton-Schulz iteration (bfloat16 as on GPUs; float32 reproduces exactly)"
    gpus_per_worker: int = 0
    "GPUs each worker process gets (its CUDA_VISIBLE_DEVICES); 0 trains on the CPU"
    on_nonfinite: str = ""
    "a step whose loss is NaN or infinite: warn and train on, roll back to the latest checkpoint (skipping the data since), or fail the job"
    spike_zscore: float | None = None
    "roll back to the latest checkpoint (skipping the data since) when a step's loss lies this many standard deviations above the mean of the last spike_window losses; unset: no spike detection"
    spike_window: int | None = None
    "the losses spike_zscore compares a step's loss with (with spike_zscore; detection starts once it is full)"
    max_rollbacks: int | None = None
    "rollbacks one run of the workers survives; the next loss spike or non-finite loss fails the job"
    rollback_lr_scale: float | None = None
    "the learning rate's factor after each rollback (0.5: halved after the first, quartered after the second)"
    compile: bool = False
    "torch.compile each transformer block (regional compilation): faster steps after a first step that compiles"
    float8: bool = False
    "float8 matmuls in training (torchao) on NVIDIA GPUs of compute capability 8.9 or newer (H100, H200, L40S); refused for a job that would train on the CPU"
    pp: int = 0
    "pipeline-parallel ranks (torch.distributed.pipelining): the decoder's layers split into stages, workers = pp x dp_shard x tp (each stage sharded with FSDP2 and tensor parallelism); untied Llama/Qwen3 decoders, not yet with dp_replicate"
    pp_schedule: str = ""
    "the pipeline's schedule: 1f1b (one stage per rank) or interleaved-1f1b (two stages per rank)"
    pp_microbatches: int = 0
    "micro-batches each batch is split into through the pipeline (with pp > 1); must divide batch_size"
    request_id: str = dataclasses.field(default_factory=_request_id)
