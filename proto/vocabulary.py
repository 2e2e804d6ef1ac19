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

from cantata.proto.models import BYTE_GPTS, MODEL_SHAPES, Model  # noqa: F401  (the generated catalog, read from here)
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


Shape = int | float | bool  # a value of a model's shape


def model_architecture(model: Model) -> str:
    """The ``architecture`` a downloaded checkpoint's config.json names."""
    return "cantata-gpt" if model in BYTE_GPTS else "cantata-decoder"


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
