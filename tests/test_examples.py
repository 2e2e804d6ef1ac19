"""Every job in examples/ is one the SDK and the server's own parser accept as written."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cantata.sdk.job import Job
from cantata.server.jobs.jobspec import parse_job_spec

EXAMPLES = sorted((Path(__file__).parents[1] / "examples").rglob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_an_example_passes_the_sdk_and_the_servers_parser(path, tmp_path):
    job = Job.from_dict(yaml.safe_load(path.read_text()))
    job.validate()
    spec = parse_job_spec(job.to_proto(), default_store=(tmp_path / "ckpt").as_uri(), roots=[tmp_path])
    assert spec.name == job.name and spec.steps == job.steps


def test_the_qwen3_example_fine_tunes_from_s3_with_a_bpe_tokenizer_on_a_mesh(tmp_path):
    job = Job.from_dict(
        yaml.safe_load((Path(__file__).parents[1] / "examples" / "finetune" / "qwen3.yaml").read_text())
    )
    spec = parse_job_spec(job.to_proto(), default_store=(tmp_path / "ckpt").as_uri(), roots=[tmp_path])
    assert spec.model.startswith("qwen3-") and spec.tokenizer.startswith("sha256:") and spec.tokenizer_vocab > 256
    assert spec.dataset.startswith("s3://") and spec.init_from.startswith("s3://")
    assert (spec.dp_shard, spec.tp, spec.workers) == (2, 2, 4) and spec.gpus_per_worker == 1
