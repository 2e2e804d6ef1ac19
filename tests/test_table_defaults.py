"""The trainer's fallbacks for unset fields are the job-field table's defaults, not numbers of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from cantata.proto import jobfields
from cantata.proto.v1 import common_pb2
from cantata.server.jobs.jobspec import parse_job_spec
from cantata.trainer.loop import Schedule
from cantata.trainer.optim.muon import MuonConfig
from cantata.trainer.optim.training import spec_settings
from cantata.trainer.recovery import RecoveryPolicy


def _parsed(**fields) -> common_pb2.JobSpec:
    spec = common_pb2.JobSpec(name="t", steps=100, **fields)
    return parse_job_spec(spec, default_store="file:///tmp/ckpt", roots=[Path("/tmp")])


def test_muon_settings_of_an_unset_spec_are_those_the_server_fills_in():
    assert spec_settings(common_pb2.JobSpec(optimizer="muon")) == spec_settings(_parsed(optimizer="muon"))
    default = MuonConfig()
    assert (default.momentum, default.ns_steps) == (
        jobfields.server_default("muon_momentum", optimizer="muon"),
        jobfields.server_default("muon_ns_steps", optimizer="muon"),
    )


def test_the_schedule_and_recovery_defaults_are_the_servers():
    parsed = _parsed()
    schedule = Schedule(parsed.lr, parsed.steps, parsed.warmup_steps)
    assert schedule == Schedule.of(parsed)
    assert RecoveryPolicy.of(common_pb2.JobSpec()).on_nonfinite == parsed.on_nonfinite
    assert RecoveryPolicy.of(common_pb2.JobSpec()).lr_scale == parsed.rollback_lr_scale


def test_a_default_the_server_takes_from_its_settings_has_no_table_value():
    with pytest.raises(ValueError, match="from its settings"):
        jobfields.server_default("checkpoint_store")
