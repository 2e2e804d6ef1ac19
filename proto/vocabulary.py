"""The platform's words, written once: every package imports them from here.

Algorithms, optimizers, topologies, compressions, UTF-8 policies and model
names a job may name; which job states are terminal; the request-id rule; the
secret fields of each data-source kind. This module imports nothing of ours but
the generated protobuf modules, so the SDK, the server and the trainer may all
depend on it.
"""

from __future__ import annotations

import enum
import re

from cantata.proto.v1 import common_pb2


class Algorithm(enum.StrEnum):
    """How a job's workers train together."""

    SINGLE = "single"
    ALLREDUCE = "allreduce"
    GASLOC = "gasloc"
    DILOCO = "diloco"


DECENTRALIZED = frozenset({Algorithm.GASLOC, Algorithm.DILOCO})  # worker groups that gossip or average


class Optimizer(enum.StrEnum):
    ADAMW = "adamw"
    MUON = "muon"


class CostUnit(enum.StrEnum):
    """How Canzona's partitioner weighs a matrix's Muon update."""

    FLOPS = "flops"  # Newton-Schulz FLOPs: what the update costs to compute
    NUMEL = "numel"  # elements, as the authors' partitioner counts them


class NsDtype(enum.StrEnum):
    """The precision of Muon's Newton-Schulz iteration."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"


class Topology(enum.StrEnum):
    """The gossip graph of a gasloc job."""

    RING = "ring"
    TORUS = "torus"
    EXPONENTIAL = "exponential"
    COMPLETE = "complete"
    ONE_PEER = "one-peer"
    TWO_PEER = "two-peer"


class Compression(enum.StrEnum):
    """How gossiped updates are encoded on the wire."""

    NONE = "none"
    BF16 = "bf16"
    INT8 = "int8"


class OnNonfinite(enum.StrEnum):
    """What a single or allreduce job does when a step's loss is not a finite number."""

    WARN = "warn"  # log a warning and train on
    ROLLBACK = "rollback"  # roll back to the latest checkpoint and skip the data since (cantata.trainer.recovery)
    FAIL = "fail"  # fail the job at once, permanently


class Utf8Policy(enum.StrEnum):
    """What to do with dataset text that is not valid UTF-8."""

    SKIP = "skip"  # drop the object or record, with a warning event
    FAIL = "fail"


class LrSchedule(enum.StrEnum):
    """How the learning rate decays after its warm-up, down to ``min_lr_ratio`` of its peak."""

    COSINE = "cosine"
    LINEAR = "linear"
    CONSTANT = "constant"


class MixedPrecision(enum.StrEnum):
    """The dtype a sharded model computes in (gradients are reduced in fp32)."""

    FP32 = "fp32"
    BF16 = "bf16"


class PipelineSchedule(enum.StrEnum):
    """How a pipeline-parallel job's stages interleave micro-batches (``torch.distributed.pipelining``)."""

    ONE_F_ONE_B = "1f1b"  # one stage per rank
    INTERLEAVED_1F1B = "interleaved-1f1b"  # two stages per rank: a smaller bubble


class Model(enum.StrEnum):
    """The model configurations the server accepts: two byte GPTs, then the Llama/Qwen3 decoder family."""

    GPT_TINY = "gpt-tiny"
    GPT_SMALL = "gpt-small"
    LLAMA_TINY = "llama-tiny"
    QWEN3_TINY = "qwen3-tiny"
    QWEN3_0_6B = "qwen3-0.6b"
    QWEN3_1_7B = "qwen3-1.7b"
    QWEN3_4B = "qwen3-4b"
    QWEN3_8B = "qwen3-8b"
    QWEN3_14B = "qwen3-14b"
    QWEN3_32B = "qwen3-32b"
    LLAMA3_8B = "llama3-8b"
    LLAMA3_70B = "llama3-70b"


BYTE_GPTS = frozenset({Model.GPT_TINY, Model.GPT_SMALL})  # cantata.trainer.model.GPT; the rest: Decoder
Shape = int | float | bool  # a value of a model's shape


def model_architecture(model: Model) -> str:
    """The ``architecture`` a downloaded checkpoint's config.json names."""
    return "cantata-gpt" if model in BYTE_GPTS else "cantata-decoder"


def _decoder(dim: int, layers: int, heads: int, ffn: int, *, tie: bool, qwen3: bool) -> dict[str, Shape]:
    """A shape of the published configs, with head_dim 128 and 8 key/value heads in both families.

    Qwen3: vocabulary 151936, rope theta 1e6, RMSNorm of queries and keys;
    Llama 3: vocabulary 128256, rope theta 500000.
    """
    return {
        "dim": dim,
        "n_layers": layers,
        "n_heads": heads,
        "n_kv_heads": 8,
        "head_dim": 128,
        "ffn_dim": ffn,
        "vocab_size": 151936 if qwen3 else 128256,
        "block_size": 40960 if qwen3 else 8192,
        "rope_theta": 1_000_000.0 if qwen3 else 500_000.0,
        "norm_eps": 1e-6 if qwen3 else 1e-5,
        "tie_embeddings": tie,
        "qk_norm": qwen3,
    }


_TINY = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 192, "vocab_size": 512, "block_size": 512}
# Each model's shape: what the trainer builds and what a downloaded checkpoint's config.json describes.
MODEL_SHAPES: dict[Model, dict[str, Shape]] = {
    Model.GPT_TINY: {"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 256, "vocab_size": 256},
    Model.GPT_SMALL: {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 512, "vocab_size": 256},
    Model.LLAMA_TINY: {**_decoder(0, 0, 0, 0, tie=False, qwen3=False), **_TINY, "head_dim": 16},
    # heads x head_dim != dim, as in Qwen3-0.6B and 32B
    Model.QWEN3_TINY: {**_decoder(0, 0, 0, 0, tie=True, qwen3=True), **_TINY, "head_dim": 32},
    Model.QWEN3_0_6B: _decoder(1024, 28, 16, 3072, tie=True, qwen3=True),
    Model.QWEN3_1_7B: _decoder(2048, 28, 16, 6144, tie=True, qwen3=True),
    Model.QWEN3_4B: _decoder(2560, 36, 32, 9728, tie=True, qwen3=True),
    Model.QWEN3_8B: _decoder(4096, 36, 32, 12288, tie=False, qwen3=True),
    Model.QWEN3_14B: _decoder(5120, 40, 40, 17408, tie=False, qwen3=True),
    Model.QWEN3_32B: _decoder(5120, 64, 64, 25600, tie=False, qwen3=True),
    Model.LLAMA3_8B: _decoder(4096, 32, 32, 14336, tie=False, qwen3=False),
    Model.LLAMA3_70B: _decoder(8192, 80, 64, 28672, tie=False, qwen3=False),
}


# Every job state's name, in lifecycle order (what filters and listings accept).
STATE_NAMES = tuple(name for name in common_pb2.JobState.keys() if name != "JOB_STATE_UNSPECIFIED")  # noqa: SIM118
TERMINAL_STATES = frozenset({common_pb2.SUCCEEDED, common_pb2.FAILED, common_pb2.CANCELLED})


def is_terminal(state: int | str) -> bool:
    """Whether a job in ``state`` (a ``JobState`` value or its name) has ended for good."""
    if isinstance(state, str):
        state = common_pb2.JobState.Value(state)
    return state in TERMINAL_STATES


REQUEST_ID = re.compile(r"[A-Za-z0-9_.:-]{8,128}")
REQUEST_ID_RULE = "8-128 characters [A-Za-z0-9_.:-]"


def valid_request_id(request_id: str) -> bool:
    """Whether ``request_id`` may name a submission (``REQUEST_ID_RULE``)."""
    return REQUEST_ID.fullmatch(request_id) is not None


DATA_SOURCE_SECRETS = {  # data-source kind -> the secret fields its credentials may hold
    "s3": ("access_key_id", "secret_access_key", "session_token", "region"),
    "az": ("connection_string", "account_name", "account_key", "sas_token"),
}


ERROR_DOMAIN = "cantata"  # google.rpc ErrorInfo.domain of every error the server raises
REQUEST_ID_KEY = "cantata-request-id"  # trailer of every reply, also sent as a RequestInfo detail


class ErrorReason(enum.StrEnum):
    """``ErrorInfo.reason`` of the server's errors: what the SDK turns into a typed exception."""

    NOT_FOUND = "NOT_FOUND"
    DATA_SOURCE_NOT_FOUND = "DATA_SOURCE_NOT_FOUND"
    CONFLICT = "CONFLICT"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    REQUEST_ID_REUSED = "REQUEST_ID_REUSED"  # the same request id with a different job spec
    DATA_SOURCE_EXISTS = "DATA_SOURCE_EXISTS"
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
    ENROLLMENT_LIMITED = "ENROLLMENT_LIMITED"  # an anonymous enrollment limit: pending requests or rate per address
    INVALID_JOB = "INVALID_JOB"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    INVALID_DATA_SOURCE = "INVALID_DATA_SOURCE"
    INVALID_NAME = "INVALID_NAME"
    INVALID_WEBHOOK = "INVALID_WEBHOOK"  # a webhook URL refused (scheme, length, an address it may not reach)
    INVALID_CSR = "INVALID_CSR"
    INVALID_ATTACK = "INVALID_ATTACK"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    UNAVAILABLE = "UNAVAILABLE"
    DATA_LOSS = "DATA_LOSS"
    STORE_NOT_FOUND = "STORE_NOT_FOUND"  # a job's bucket or container does not exist
    STORE_PERMISSION_DENIED = "STORE_PERMISSION_DENIED"  # a store refused the credentials or the action
    STORE_FULL = "STORE_FULL"  # a local store has no space left
