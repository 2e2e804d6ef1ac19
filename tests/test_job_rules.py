"""The SDK and the server give every job spec and data-source registration the same verdict, in the same words.

Both run :mod:`cantata.proto.jobrules` and :mod:`cantata.proto.datasource_rules`;
these tests hold them to it on hand-picked specs (those the SDK used to accept
and the server refused) and on generated ones. What only the server can know
stays out of the generated specs: the tenant's ``file://`` roots, the store
prefixes, a node's memory, and a data source's name and endpoint. So does the
unset value of a field whose SDK default is set (the SDK refuses ``model=""``;
the server fills it in), which a ``Job`` never sends unless told to.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cantata.proto import jobfields
from cantata.proto.datasource_rules import DATASET_KEY_SIZE
from cantata.proto.vocabulary import DATA_SOURCE_SECRETS
from cantata.sdk.client import data_source_request
from cantata.sdk.errors import InvalidArgument, InvalidJob
from cantata.sdk.job import Job
from cantata.server.datasource_store import DataSourceSpec, InvalidDataSource
from cantata.server.jobs.jobspec import InvalidField, parse_job_spec

SHA = "sha256:" + "ab" * 32
# Specs the SDK accepted and the server refused before the rules were shared (each breaks one rule).
DISAGREED = [
    {"algorithm": "single", "workers": 2},
    {"warmup_steps": 500, "steps": 300},
    {"algorithm": "diloco", "workers": 2, "topology": "ring"},
    {"algorithm": "diloco", "workers": 2, "gossip_step": 0.5},
    {"algorithm": "diloco", "workers": 2, "compression": "int8"},
    {"muon_ns_steps": 3},
    {"spike_window": 10},
    {"algorithm": "gasloc", "workers": 8, "ranks_per_worker": 64},
    {"algorithm": "gasloc", "workers": 1},
    {"algorithm": "gasloc", "workers": 3, "min_workers": 4},
    {"ranks_per_worker": 2},
    {"tokenizer": SHA},
    {"tokenizer_vocab": 1_000_000},
    {"model": "llama-tiny", "dp_shard": 2, "workers": 3},
    {"float8": True},
    {"dataset": "s3://bucket/prefix"},
    {"algorithm": "gasloc", "workers": 2, "ranks_per_worker": 2, "dp_shard": 3},
]


def _sdk(job: Job) -> str | None:
    try:
        job.validate()
    except InvalidJob as refused:
        assert refused.field == str(refused).partition(":")[0]
        return str(refused)
    return None


def _server(job: Job, root: Path) -> str | None:
    try:
        parse_job_spec(job.to_proto(), default_store=(root / "checkpoints").as_uri(), roots=[root])
    except InvalidField as refused:
        return str(refused)
    return None


@pytest.mark.parametrize("fields", DISAGREED, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_specs_that_disagreed_are_refused_by_both_in_the_same_words(fields, tmp_path):
    job = Job(name="probe", **fields)
    said = _sdk(job)
    assert said is not None and said == _server(job, tmp_path)


def _values(f: jobfields.JobField) -> list:
    """Values of ``f`` a ``Job`` may send: of its type, set or (where the SDK allows it) unset, in range or out."""
    locations = {
        "dataset": ["builtin:pystdlib", "builtin:other", "s3://src@bucket/data", "s3://bucket/data", "az://src@B_d/x"],
        "init_from": ["", "s3://src@bucket/weights", "az://bucket/weights", "s3://src@-bad-/w"],
        "tokenizer": ["", SHA, "sha256:XYZ"],
        "checkpoint_store": [""],
        "name": ["probe"],
    }
    if f.name in locations:
        return locations[f.name]
    values: list = []
    if f.choices is not None:
        values += [c.value for c in f.choices]
    elif f.kind is bool:
        values += [False, True]
    elif f.kind is tuple:
        values += [(), ("nightly",), ("a", "a")]
    elif f.range is not None:
        low = f.range.low if f.range.low is not None else 0
        high = f.range.high if f.range.high is not None else low + 1000
        if f.kind is int:
            values += sorted({int(low), int(low) + 1, int(high), int(high) + 1, int(low) - 1, 2, 3, 4, 64})
        else:
            values += [low, (low + high) / 2, high, high + 1, math.nextafter(low, -math.inf)]
    if f.sdk_unset_ok:
        values.append(f.zero)
    elif f.sdk_default is not jobfields.REQUIRED:
        values = [v for v in values if v != f.zero] or [f.sdk_default]
    return values


FIELD_VALUES = {f.name: _values(f) for f in jobfields.FIELDS if f.name != "name"}
SPECS = st.dictionaries(st.sampled_from(sorted(FIELD_VALUES)), st.just(None), min_size=1, max_size=6).flatmap(
    lambda keys: st.fixed_dictionaries({k: st.sampled_from(FIELD_VALUES[k]) for k in keys})
)


@settings(max_examples=600, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(fields=SPECS)
def test_generated_specs_get_the_same_verdict_from_the_sdk_and_the_server(fields, tmp_path_factory):
    root = tmp_path_factory.getbasetemp()
    job = Job(name="probe", **fields)
    assert _sdk(job) == _server(job, root), fields


# ---- data-source credentials -----------------------------------------------
def _client(kind: str, secrets: dict[str, str], key: bytes | None) -> str | None:
    try:
        data_source_request("corpus", kind, "https://acct.example", secrets, key, replace=False)
    except InvalidArgument as refused:
        return str(refused)
    return None


def _registry(kind: str, secrets: dict[str, str], key: bytes | None) -> str | None:
    try:
        DataSourceSpec("corpus", kind, "https://acct.example", secrets, key)
    except InvalidDataSource as refused:
        return str(refused)
    return None


SECRET_NAMES = sorted({name for names in DATA_SOURCE_SECRETS.values() for name in names})
REGISTRATIONS = st.tuples(
    st.sampled_from([*DATA_SOURCE_SECRETS, "gcs"]),
    st.dictionaries(st.sampled_from(SECRET_NAMES), st.sampled_from(["", "value"]), max_size=5),
    st.sampled_from([None, bytes(DATASET_KEY_SIZE), bytes(16)]),
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(registration=REGISTRATIONS)
def test_the_sdk_and_the_server_check_credentials_alike(registration):
    assert _client(*registration) == _registry(*registration), registration
