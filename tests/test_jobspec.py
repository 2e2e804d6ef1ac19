"""Server-side parsing of gasloc/diloco job fields: defaults are filled in, nonsense is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from cantata.proto.v1 import common_pb2
from cantata.sdk.job import Job
from cantata.server.jobs.jobspec import InvalidField, parse_job_spec


def _parse(**fields) -> common_pb2.JobSpec:
    return parse_job_spec(
        common_pb2.JobSpec(name="x", steps=40, **fields), default_store="file:///tmp/ckpt", roots=[Path("/tmp")]
    )


def test_decentralized_defaults_are_filled_in_so_the_stored_spec_is_what_runs():
    gasloc = _parse(algorithm="gasloc", workers=4)
    assert (gasloc.local_steps, gasloc.outer_lr, gasloc.outer_momentum, gasloc.topology) == (20, 1.0, 0.5, "ring")
    assert gasloc.min_workers == 3 and gasloc.compression == "none"
    assert not gasloc.HasField("gossip_step")  # Metropolis, chosen per round by the topology
    diloco = _parse(algorithm="diloco", workers=5)
    assert (diloco.outer_lr, diloco.outer_momentum, diloco.topology, diloco.min_workers) == (0.7, 0.9, "complete", 3)


def test_an_explicit_zero_momentum_is_kept_not_replaced_by_the_default():
    spec = Job(name="x", algorithm="gasloc", workers=2, outer_momentum=0.0).to_proto()
    assert spec.HasField("outer_momentum") and not spec.HasField("outer_lr")
    parsed = _parse(algorithm="gasloc", workers=2, outer_momentum=0.0, gossip_step=0.25)
    assert parsed.outer_momentum == 0.0 and parsed.outer_lr == 1.0 and parsed.gossip_step == 0.25


@pytest.mark.parametrize(
    "field,fields",
    [
        ("outer_momentum", {"algorithm": "gasloc", "workers": 2, "outer_momentum": 1.0}),
        ("outer_lr", {"algorithm": "gasloc", "workers": 2, "outer_lr": 0.0}),
        ("gossip_step", {"algorithm": "gasloc", "workers": 2, "gossip_step": 1.5}),
        ("gossip_step", {"algorithm": "diloco", "workers": 4, "gossip_step": 0.5}),
        ("topology", {"algorithm": "diloco", "workers": 4, "topology": "ring"}),
        ("topology", {"algorithm": "gasloc", "workers": 4, "topology": "star"}),
        ("compression", {"algorithm": "gasloc", "workers": 4, "compression": "fp4"}),
        ("min_workers", {"algorithm": "gasloc", "workers": 4, "min_workers": 5}),
        ("min_workers", {"algorithm": "gasloc", "workers": 4, "min_workers": -1}),
        ("local_steps", {"algorithm": "gasloc", "workers": 4, "local_steps": 20_000}),
        # fields that would be silently ignored by the other algorithms
        ("outer_lr", {"algorithm": "allreduce", "workers": 2, "outer_lr": 0.7}),
        ("local_steps", {"algorithm": "allreduce", "workers": 2, "local_steps": 5}),
        ("min_workers", {"algorithm": "allreduce", "workers": 2, "min_workers": 1}),
        ("compression", {"algorithm": "single", "compression": "bf16"}),
        ("compression", {"algorithm": "diloco", "workers": 4, "compression": "int8"}),
        ("round_deadline_s", {"algorithm": "gasloc", "workers": 4, "round_deadline_s": 0.0}),
        ("round_deadline_s", {"algorithm": "allreduce", "workers": 2, "round_deadline_s": 5.0}),
        ("round_time_s", {"algorithm": "diloco", "workers": 2, "round_time_s": -1.0}),
        ("round_time_s", {"algorithm": "single", "round_time_s": 2.0}),
    ],
)
def test_bad_or_misplaced_decentralized_fields_are_refused_by_name(field, fields):
    with pytest.raises(InvalidField) as err:
        _parse(**fields)
    assert err.value.field == field
