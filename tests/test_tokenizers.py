"""A tenant's own tokenizer: prepared shards record it, jobs name it, and tokens the model cannot read fail by name.

The tokenizer is a small byte-level BPE trained here with the ``tokenizers``
library's own trainer; nothing is downloaded.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from cantata.proto.v1 import common_pb2
from cantata.sdk.job import Job
from cantata.server.jobs.jobspec import InvalidField, parse_job_spec
from cantata.trainer.data import ShardHeaderError, TextTokenizer, Vocabulary, VocabularyError, open_dataset
from cantata.trainer.data.prepare import prepare_shards
from cantata.trainer.data.shards import ShardHeader, decode_shard, dtype_for, encode_shard, open_shard
from testkit.platform import cli, readable

VOCAB = 400  # more than the byte GPTs' 256, within the tiny decoders' 512
QUICK = dict(steps=20, eval_every=20, checkpoint_every=20, batch_size=4, seq_len=32, eval_batches=2)


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> Path:
    """About 120 kB of Python source as text files."""
    out = tmp_path_factory.mktemp("text")
    written = 0
    for index, path in enumerate(sorted(Path(json.__file__).parent.parent.glob("*.py"))):
        body = path.read_text(errors="ignore")
        (out / f"{index:04d}.txt").write_text(body)
        written += len(body)
        if written > 120_000:
            break
    return out


@pytest.fixture(scope="module")
def tokenizer_file(text, tmp_path_factory) -> Path:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"]
    )
    tokenizer.train_from_iterator((p.read_text() for p in sorted(text.iterdir())), trainer=trainer)
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


@pytest.fixture(scope="module")
def prepared(text, tokenizer_file, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bpe") / "shards"
    result = prepare_shards(
        text, out, dtype=np.dtype("uint16"), shard_tokens=20_000, tokenizer=TextTokenizer.from_file(tokenizer_file)
    )
    assert result.tokenizer is not None and result.tokenizer.vocab_size == VOCAB
    return out


def test_prepared_shards_record_the_tokenizer_and_round_trip_the_text(text, tokenizer_file, prepared):
    tokenizer = TextTokenizer.from_file(tokenizer_file)
    shards = sorted(prepared.iterdir())
    headers = [open_shard(p.read_bytes(), p.name)[0] for p in shards]
    assert {h.tokenizer for h in headers} == {tokenizer.record}
    tokens = np.concatenate([decode_shard(p.read_bytes(), p.name) for p in shards])
    assert int(tokens.max()) >= 256  # merges: ids a byte model has no embedding for
    expected = "".join(p.read_text() for p in sorted(text.iterdir()))
    assert Tokenizer.from_file(str(tokenizer_file)).decode(tokens.tolist()) == expected
    assert tokens.size < 0.6 * len(expected.encode())  # BPE compresses


def test_a_tokenizer_header_is_covered_by_its_checksum(tokenizer_file):
    record = TextTokenizer.from_file(tokenizer_file).record
    data = bytearray(encode_shard(np.arange(300), dtype_for("uint16"), record))
    header = ShardHeader.decode(data, "s")
    assert (header.tokenizer, header.size) == (record, 60)
    data[30] ^= 0x01  # inside the digest
    with pytest.raises(ShardHeaderError, match="shard s: header checksum mismatch"):
        decode_shard(data, "s")


def test_the_loader_refuses_ids_past_the_vocabulary_and_other_tokenizers_by_shard(prepared, tokenizer_file, tmp_path):
    record = TextTokenizer.from_file(tokenizer_file).record
    dataset = open_dataset(prepared.as_uri(), allowed_roots=[prepared], vocabulary=Vocabulary(256))
    with pytest.raises(VocabularyError, match=r"shard .*shard-00000\.tok holds token id \d+, outside .* of 256"):
        dataset.tokens(dataset.objects[0], print)
    fits = open_dataset(prepared.as_uri(), allowed_roots=[prepared], vocabulary=Vocabulary(512, record.name))
    assert fits.tokens(fits.objects[0], print).size == 20_000
    other = open_dataset(prepared.as_uri(), allowed_roots=[prepared], vocabulary=Vocabulary(512, "sha256:" + "0" * 64))
    with pytest.raises(VocabularyError, match=r"shard .*shard-00000\.tok was made by tokenizer sha256:"):
        other.tokens(other.objects[0], print)
    (tmp_path / "a.txt").write_text("plain text")
    text = open_dataset(tmp_path.as_uri(), allowed_roots=[tmp_path], vocabulary=Vocabulary(512, record.name))
    with pytest.raises(VocabularyError, match=r"text object .*a\.txt would be read as bytes"):
        text.tokens(text.objects[0], print)


def test_data_prepare_takes_a_tokenizer_and_prints_what_the_job_names(text, tokenizer_file, tmp_path):
    out = json.loads(
        cli(
            "data", "prepare", str(text), "--out", str(tmp_path / "o"), "--tokenizer", str(tokenizer_file), "--json"
        ).stdout
    )
    assert out["tokenizer"] == TextTokenizer.from_file(tokenizer_file).record.name
    assert out["tokenizer_vocab"] == VOCAB
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a tokenizer"}')
    refused = cli("data", "prepare", str(text), "--out", str(tmp_path / "b"), "--tokenizer", str(bad), check=False)
    assert refused.returncode != 0 and f"tokenizer {bad} is not a tokenizer.json" in refused.stderr
    assert not any((tmp_path / "b").glob("*.tok"))


def _parse(**fields) -> common_pb2.JobSpec:
    return parse_job_spec(
        common_pb2.JobSpec(name="x", steps=10, dataset="s3://lake@bucket/p", **fields),
        default_store="file:///tmp/c",
        roots=[],
    )


def test_submit_checks_the_tokenizer_against_the_models_vocabulary():
    digest = "sha256:" + "ab" * 32
    assert _parse(model="qwen3-tiny", tokenizer=digest, tokenizer_vocab=512).tokenizer == digest
    assert _parse(model="qwen3-0.6b", tokenizer=digest, tokenizer_vocab=151_669).tokenizer_vocab == 151_669
    refusals = [
        (dict(model="gpt-tiny", tokenizer=digest, tokenizer_vocab=400), "tokenizer_vocab", "vocabulary is 256"),
        (dict(model="qwen3-tiny", tokenizer=digest), "tokenizer_vocab", "give the tokenizer's vocabulary size"),
        (dict(model="qwen3-tiny", tokenizer="sha256:XYZ", tokenizer_vocab=9), "tokenizer", "64 lower-case hex"),
        (dict(model="qwen3-tiny", tokenizer="md5:ab", tokenizer_vocab=9), "tokenizer", "unknown scheme"),
    ]
    for fields, field, words in refusals:
        with pytest.raises(InvalidField, match=words) as caught:
            _parse(**fields)
        assert caught.value.field == field


@pytest.fixture(scope="module")
def dataset(platform, prepared) -> str:
    target = platform.tenant_dir("acme", "datasets") / "bpe"
    shutil.copytree(prepared, target)
    return readable(target).as_uri()


def test_a_tenant_trains_qwen3_tiny_on_its_own_tokenizer_and_a_byte_model_fails_naming_the_shard(
    tenant, dataset, tokenizer_file
):
    record = TextTokenizer.from_file(tokenizer_file).record
    tokenized = dict(tokenizer=record.name, tokenizer_vocab=record.vocab_size)
    good = tenant.submit(Job(name="bpe", model="qwen3-tiny", dataset=dataset, **tokenized, **QUICK))
    wrong = tenant.submit(Job(name="bytes", model="gpt-tiny", dataset=dataset, **QUICK))
    status = good.wait()
    assert status.state == "SUCCEEDED", status.reason
    losses = [event.loss for event in good.events() if event.kind == "PROGRESS"]
    assert losses[-1] < losses[0]
    failed = wrong.wait()
    assert failed.state == "FAILED"
    assert "VocabularyError" in failed.reason and "outside the model's vocabulary of 256" in failed.reason
    assert "shard-0000" in failed.reason
