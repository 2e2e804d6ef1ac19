"""The job-field table, the proto, the SDK ``Job``, the CLI flags, the server's defaults and the JSON Schema agree."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from google.protobuf.descriptor import FieldDescriptor

from cantata.proto import jobfields, vocabulary
from cantata.proto.jobfields import FIELDS, REQUIRED, Rule
from cantata.proto.v1 import common_pb2
from cantata.sdk.cli import S3_ENV, build_parser
from cantata.sdk.errors import InvalidJob
from cantata.sdk.job import Job
from cantata.server.jobs.jobspec import InvalidField, parse_job_spec

DOCS = Path(__file__).resolve().parent.parent / "docs"
PROTO_TYPES = {
    FieldDescriptor.CPPTYPE_STRING: str,
    FieldDescriptor.CPPTYPE_INT32: int,
    FieldDescriptor.CPPTYPE_INT64: int,
    FieldDescriptor.CPPTYPE_DOUBLE: float,
    FieldDescriptor.CPPTYPE_BOOL: bool,
}


def test_the_table_is_the_proto_job_spec():
    proto = common_pb2.JobSpec.DESCRIPTOR.fields
    assert [f.name for f in FIELDS] == [f.name for f in proto]
    for row, field in zip(FIELDS, proto, strict=True):
        repeated = field.is_repeated
        assert row.kind is (tuple if repeated else PROTO_TYPES[field.cpp_type]), row.name
        assert not repeated or field.cpp_type == FieldDescriptor.CPPTYPE_STRING, row.name  # lists are of strings
        assert row.optional == field.has_presence, row.name


def test_the_sdk_job_has_the_table_fields_and_defaults():
    fields = {f.name: f for f in dataclasses.fields(Job)}
    assert list(fields) == [f.name for f in FIELDS] + ["request_id"]
    for row in FIELDS:
        if row.sdk_default is REQUIRED:
            assert fields[row.name].default is dataclasses.MISSING
        else:
            assert fields[row.name].default == row.sdk_default, row.name
    first, second = Job(name="a").request_id, Job(name="a").request_id
    assert first != second and len(first) == 32 and vocabulary.valid_request_id(first)


def _submit_parser() -> argparse.ArgumentParser:
    parser, _ = build_parser()
    jobs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["jobs"]
    return next(a for a in jobs._actions if isinstance(a, argparse._SubParsersAction)).choices["submit"]


def test_jobs_submit_has_one_flag_per_field_with_its_choices_and_default():
    actions = {a.dest: a for a in _submit_parser()._actions}
    for row in FIELDS:
        action = actions[row.name]
        assert action.option_strings[0] == "--" + (row.flag or row.name).replace("_", "-")
        assert action.default is None  # an absent flag leaves the file's value alone
        assert row.default_text() in action.help, row.name
        if row.kind is bool:
            assert isinstance(action, argparse.BooleanOptionalAction)
        elif row.kind is tuple:
            assert isinstance(action, argparse._AppendAction), row.name  # the flag once per item
        else:
            assert action.type is row.kind, row.name
            assert action.choices == ([c.value for c in row.choices] if row.choices else None), row.name


def test_boolean_and_choice_flags_parse():
    parser = _submit_parser()
    args = parser.parse_args(["--profile", "p", "--trace-samples", "--on-bad-utf8", "fail", "--outer-lr", "0.5"])
    assert (args.trace_samples, args.on_bad_utf8, args.outer_lr) == (True, "fail", 0.5)
    assert parser.parse_args(["--profile", "p", "--no-trace-samples"]).trace_samples is False
    assert parser.parse_args(["--profile", "p", "--tag", "a", "--tag", "team=nlp"]).tags == ["a", "team=nlp"]
    with pytest.raises(SystemExit):
        parser.parse_args(["--profile", "p", "--topology", "star"])


@pytest.mark.parametrize("algorithm", list(vocabulary.Algorithm))
def test_parse_job_spec_fills_the_table_defaults(algorithm):
    workers = 1 if algorithm == vocabulary.Algorithm.SINGLE else 4
    spec = common_pb2.JobSpec(name="x", steps=40, algorithm=algorithm, workers=workers)
    parsed = parse_job_spec(spec, default_store="file:///tmp/ckpt", roots=[Path("/tmp")])
    for row in FIELDS:
        value = jobfields.value_of(parsed, row)
        if row.name in ("name", "steps", "algorithm", "workers", "checkpoint_store"):  # given, or asserted below
            continue
        if algorithm not in row.algorithms or row.server_default is None:
            assert value == row.zero, row.name
        elif isinstance(row.server_default, Rule):
            expected = row.server_default.compute(parsed) if row.server_default.compute else None
            assert value == (expected if expected is not None else row.zero), row.name
        else:
            assert value == row.server_default, row.name
    assert parsed.checkpoint_store == "file:///tmp/ckpt"


def test_the_published_documents_are_fresh():
    for name, text in jobfields.documents().items():
        assert (DOCS / name).read_text() == text, (
            f"docs/{name} is stale: python -m cantata.proto.jobfields --write docs"
        )
    assert jobfields.main(["--check", str(DOCS)]) == 0


def test_a_stale_document_is_caught(tmp_path):
    assert jobfields.main(["--write", str(tmp_path)]) == 0
    assert jobfields.main(["--check", str(tmp_path)]) == 0
    (tmp_path / "job-fields.md").write_text("old")
    assert jobfields.main(["--check", str(tmp_path)]) == 1


def test_the_json_schema_has_the_table_fields_and_defaults():
    schema = json.loads((DOCS / "job.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    properties = schema["properties"]
    assert list(properties) == [f.name for f in FIELDS] + ["request_id"]
    assert schema["required"] == ["name"]
    for row in FIELDS:
        if row.sdk_default is not REQUIRED:
            default = list(row.sdk_default) if row.kind is tuple else row.sdk_default
            assert properties[row.name]["default"] == default, row.name
        if row.choices:
            assert {c for c in properties[row.name]["enum"] if c} == set(row.choices), row.name


GOOD = [
    "name: x",
    "name: x\nworkers: 4\nalgorithm: gasloc\ntopology: torus\nouter_momentum: 0\ngossip_step: 0.5",
    "name: x\nalgorithm: diloco\nworkers: 2\nlocal_steps: 10000\ncompression: bf16\nmin_workers: 2\nround_time_s: 1.5",
    "name: x\nlr: 0.1\noptimizer: muon\non_bad_utf8: fail\ntrace_samples: true\nseed: 7",
    "name: x\ndataset: s3://src@bucket/data\ncheckpoint_store: az://c/p\nrequest_id: retry-0001",
    "name: x\nbatch_size: 4096\nseq_len: 0\ncheckpoint_every: 0\nalgorithm: gasloc\nworkers: 2\nranks_per_worker: 64",
    "name: x\ntags: [nightly, team=nlp, sweep:lr/3, v1.2_rc-1]",
    "name: x\ntags: []",
]
BAD = [
    "steps: 10",  # no name
    "name: ''",
    "name: x\nflavour: spicy",
    "name: x\nworkers: 0",
    "name: x\nworkers: '4'",
    "name: x\nworkers: true",
    "name: x\nsteps: 10000001",
    "name: x\nmodel: gpt-huge",
    "name: x\nalgorithm: federated",
    "name: x\ntopology: ring",  # only for gasloc or diloco
    "name: x\nalgorithm: allreduce\nworkers: 2\nouter_lr: 0.5",
    "name: x\nalgorithm: gasloc\nworkers: 2\nouter_momentum: 1.0",
    "name: x\nalgorithm: gasloc\nworkers: 2\nouter_lr: 0",
    "name: x\nalgorithm: gasloc\nworkers: 2\ntopology: star",
    "name: x\nlr: -0.1",
    "name: x\nbatch_size: 4097",
    "name: x\non_bad_utf8: ignore",
    "name: x\ntrace_samples: 1",
    "name: x\ndataset: ftp://host/data",
    "name: x\ncheckpoint_store: /tmp/ckpt",
    "name: x\nrequest_id: short",
    "name: x\nrequest_id: 'has spaces in it'",
    "name: x\ntags: nightly",  # a list, not a string
    "name: x\ntags: [nightly, nightly]",
    "name: x\ntags: ['has space']",
    "name: x\ntags: ['-leading-dash']",
    "name: x\ntags: ['nightly\\n']",  # a full match: no trailing newline slips through
    "name: x\ntags: [" + ", ".join(f"t{i}" for i in range(17)) + "]",
    "name: x\ntags: [" + "a" * 65 + "]",
    "name: x\ntags: [1]",
]


def _sdk_accepts(data: dict) -> bool:
    try:
        Job.from_dict(data).validate()
    except (InvalidJob, TypeError):  # TypeError: no name
        return False
    return True


@pytest.mark.parametrize("text,good", [(t, True) for t in GOOD] + [(t, False) for t in BAD])
def test_the_json_schema_and_the_sdk_give_the_same_verdict(text, good):
    schema = json.loads((DOCS / "job.schema.json").read_text())
    data = yaml.safe_load(text)
    assert jsonschema.Draft202012Validator(schema).is_valid(data) == good
    assert _sdk_accepts(data) == good


@pytest.mark.parametrize(
    "field,fields",
    [
        ("model", {"model": "gpt-huge"}),
        ("steps", {"steps": 0}),
        ("workers", {"workers": 300}),
        ("lr", {"lr": float("inf")}),
        ("seed", {"seed": -1}),
        ("compression", {"compression": "bf16"}),
        ("outer_lr", {"algorithm": "gasloc", "workers": 2, "outer_lr": 11.0}),
        ("on_bad_utf8", {"on_bad_utf8": "ignore"}),
        ("tags", {"tags": ["ok", "not ok"]}),
        ("tags", {"tags": [f"t{i}" for i in range(17)]}),
    ],
)
def test_the_sdk_and_the_server_refuse_the_same_field(field, fields):
    job = Job(name="x", **fields)
    with pytest.raises(InvalidJob) as sdk:
        job.validate()
    with pytest.raises(InvalidField) as server:
        parse_job_spec(job.to_proto(), default_store="file:///tmp/ckpt", roots=[Path("/tmp")])
    assert sdk.value.field == server.value.field == field
    assert str(server.value) == sdk.value.message  # one table, one message


def test_job_states_and_request_ids_have_one_rule():
    assert vocabulary.is_terminal("SUCCEEDED") and vocabulary.is_terminal(common_pb2.CANCELLED)
    assert not vocabulary.is_terminal("CANCELLING") and not vocabulary.is_terminal(common_pb2.RUNNING)
    assert {common_pb2.JobState.Name(s) for s in vocabulary.TERMINAL_STATES} == {"SUCCEEDED", "FAILED", "CANCELLED"}
    assert vocabulary.valid_request_id("abc:DEF_1.2-3")
    assert not vocabulary.valid_request_id("abcdefgh\n")  # a full match: no trailing newline slips through
    assert not vocabulary.valid_request_id("x" * 129)


def test_the_cli_reads_exactly_the_s3_secret_fields_the_server_takes():
    assert set(S3_ENV) == set(vocabulary.DATA_SOURCE_SECRETS["s3"])
