"""Muon and Canzona job fields: checked at the edge, filled in for muon only, and read by the trainer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cantata.sdk.errors import InvalidJob
from cantata.sdk.job import Job
from cantata.server.jobs.jobspec import InvalidField, parse_job_spec
from cantata.trainer.optim import spec_settings


def parsed(**fields):
    return parse_job_spec(Job(name="t", **fields).to_proto(), default_store="file:///tmp/ckpt", roots=[Path("/tmp")])


def test_muon_jobs_get_the_defaults_and_adamw_jobs_none_of_them():
    muon = parsed(optimizer="muon")
    assert (muon.canzona_alpha, muon.canzona_bucket_elements, muon.canzona_cost_unit) == (1.0, 40_000_000, "flops")
    assert (muon.muon_momentum, muon.muon_ns_steps, muon.muon_ns_dtype) == (0.95, 5, "float32")
    adamw = parsed()
    assert not adamw.HasField("canzona_alpha") and adamw.canzona_cost_unit == "" and adamw.muon_ns_steps == 0


def test_settings_reach_the_optimizer():
    settings = spec_settings(
        parsed(
            optimizer="muon",
            canzona_alpha=0.0,
            canzona_bucket_elements=1000,
            canzona_cost_unit="numel",
            muon_momentum=0.9,
            muon_ns_steps=3,
            muon_ns_dtype="bfloat16",
        )
    )
    assert (settings["alpha"], settings["bucket_elements"], settings["cost_unit"]) == (0.0, 1000, "numel")
    config = settings["muon_config"]
    assert (config.momentum, config.ns_steps, config.ns_dtype) == (0.9, 3, torch.bfloat16)


@pytest.mark.parametrize(
    ("fields", "field", "why"),
    [
        ({"canzona_alpha": 1.5}, "canzona_alpha", r"\[0, 1\]"),
        ({"canzona_cost_unit": "bytes"}, "canzona_cost_unit", "unknown"),
        ({"muon_momentum": 1.0}, "muon_momentum", r"\[0, 1\)"),
        ({"muon_ns_steps": 100}, "muon_ns_steps", "1..99"),
        ({"muon_ns_dtype": "float16"}, "muon_ns_dtype", "unknown"),
        ({"canzona_bucket_elements": -1}, "canzona_bucket_elements", "1..10000000000"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(fields, field, why):
    with pytest.raises(InvalidJob, match=why) as client:
        Job(name="t", optimizer="muon", **fields).validate()
    assert client.value.field == field
    with pytest.raises(InvalidField, match=why) as server:
        parse_job_spec(
            Job(name="t", optimizer="muon", **fields).to_proto(), default_store="file:///tmp/ckpt", roots=[Path("/tmp")]
        )
    assert server.value.field == field


def test_muon_settings_on_an_adamw_job_are_refused():
    with pytest.raises(InvalidField, match="only with optimizer 'muon'") as refused:
        parsed(canzona_cost_unit="numel")
    assert refused.value.field == "canzona_cost_unit"
