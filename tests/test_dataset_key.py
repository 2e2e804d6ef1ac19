"""The dataset-key file the SDK reads is the one the trainer seals with."""

import base64
import json
import stat

import pytest

from cantata import dataset_key
from cantata.trainer.data import DataError, DatasetKey


def test_the_sdk_and_the_trainer_read_each_others_key_files(tmp_path):
    made_by_sdk = tmp_path / "sdk.json"
    tenant, secret = dataset_key.load_or_create(made_by_sdk, "acme")
    assert (tenant, len(secret)) == ("acme", 32)
    assert stat.S_IMODE(made_by_sdk.stat().st_mode) == 0o600
    assert DatasetKey.load_or_create(made_by_sdk, "acme") == DatasetKey("acme", secret)
    assert dataset_key.load_or_create(made_by_sdk, "other") == ("acme", secret)

    made_by_trainer = tmp_path / "trainer.json"
    key = DatasetKey.load_or_create(made_by_trainer, "acme")
    assert dataset_key.loads(made_by_trainer.read_text()) == ("acme", key.secret)


def test_the_document_format_is_unchanged():
    document = json.loads(dataset_key.dumps("acme", bytes(range(32))))
    assert document == {"tenant": "acme", "key": base64.b64encode(bytes(range(32))).decode()}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("not json", "Expecting value"),
        ('{"tenant": "acme"}', "'key'"),
        ('{"tenant": "acme", "key": "AAAA"}', "a dataset key has 32 bytes, not 3"),
    ],
)
def test_a_broken_document_is_refused_with_its_reason(text, reason):
    with pytest.raises(ValueError, match=f"invalid dataset key document: .*{reason}"):
        dataset_key.loads(text)
    with pytest.raises(DataError, match=f"invalid dataset key document: .*{reason}"):
        DatasetKey.from_json(text)
