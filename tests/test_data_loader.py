"""The streaming loader: determinism, disjoint ranks, validation split, exact resume, prefetch errors."""

import numpy as np
import pytest
import torch

from cantata.trainer.data import DataError, DataLoader, ShardChecksumError, ValidationSet, open_dataset
from cantata.trainer.data import loader as loader_module
from cantata.trainer.data.loader import STAGE_TOKENS, window_split
from cantata.trainer.data.shards import HEADER_SIZE, dtype_for, encode_shard

SEQ = 8
OBJECT_TOKENS = [801, 641, 1201, 401, 961, 561]  # 100, 80, 150, 50, 120, 70 windows


@pytest.fixture
def dataset(tmp_path):
    rng = np.random.default_rng(0)
    for index, count in enumerate(OBJECT_TOKENS):
        tokens = rng.integers(0, 256, count)
        (tmp_path / f"shard-{index:05d}.tok").write_bytes(encode_shard(tokens, dtype_for("uint16")))
    return open_dataset(tmp_path.as_uri(), allowed_roots=[tmp_path])


def _ids(loader, batches):
    return torch.cat([loader.next_batch().sample_ids for _ in range(batches)]).tolist()


def _train_windows(epoch_objects):
    return sum(window_split(OBJECT_TOKENS[o], SEQ, 0.05)[0] for o in epoch_objects)


def test_batches_hold_the_shards_windows_with_shifted_targets(dataset):
    with DataLoader(dataset, batch_size=4, seq_len=SEQ, seed=3) as loader:
        batch = loader.next_batch()
    assert batch.inputs.shape == batch.targets.shape == (4, SEQ)
    for row, sample in enumerate(batch.sample_ids.tolist()):
        tokens = dataset.tokens(dataset.objects[sample >> 32], print)
        start = (sample & 0xFFFFFFFF) * SEQ
        assert batch.inputs[row].tolist() == tokens[start : start + SEQ].tolist()
        assert batch.targets[row].tolist() == tokens[start + 1 : start + SEQ + 1].tolist()


def _reference_stream(dataset, seed, rank, world, epochs):
    """The documented order, window by window: (sample id, int64 window of SEQ + 1 tokens)."""
    loader = DataLoader(dataset, batch_size=1, seq_len=SEQ, seed=seed, rank=rank, world=world)
    for epoch in range(epochs):
        for ordinal in loader.objects_of_epoch(epoch).tolist():
            tokens = dataset.tokens(dataset.objects[ordinal], print).astype(np.int64)
            train = window_split(tokens.size, SEQ, 0.05)[0]
            for window in np.random.Generator(np.random.PCG64([seed, epoch, ordinal])).permutation(train).tolist():
                yield ordinal << 32 | window, tokens[window * SEQ : window * SEQ + SEQ + 1]


@pytest.mark.parametrize("stage_tokens", [1, 200, STAGE_TOKENS])
@pytest.mark.parametrize("batch_size", [1, 7, 32])
def test_batches_equal_a_plain_gather_of_the_documented_order(dataset, monkeypatch, batch_size, stage_tokens):
    monkeypatch.setattr(loader_module, "STAGE_TOKENS", stage_tokens)
    with DataLoader(dataset, batch_size=batch_size, seq_len=SEQ, seed=3, rank=1, world=2) as loader:
        windows = _train_windows(loader.objects_of_epoch(0)) + _train_windows(loader.objects_of_epoch(1))
        batches = [loader.next_batch() for _ in range(windows // batch_size)]
    reference = list(_reference_stream(dataset, 3, 1, 2, epochs=2))[: len(batches) * batch_size]
    ids = torch.cat([b.sample_ids for b in batches])
    assert ids.dtype == torch.int64 and ids.tolist() == [sample for sample, _ in reference]
    rows = torch.from_numpy(np.stack([row for _, row in reference]))
    inputs, targets = torch.cat([b.inputs for b in batches]), torch.cat([b.targets for b in batches])
    assert inputs.dtype == targets.dtype == torch.int64 and inputs.shape == (len(reference), SEQ)
    assert torch.equal(inputs, rows[:, :-1]) and torch.equal(targets, rows[:, 1:])


def test_validation_batches_equal_a_plain_gather_of_the_last_windows(dataset):
    batches = ValidationSet(dataset, batch_size=3, seq_len=SEQ).batches(4)
    expected = []
    for ordinal, obj in enumerate(dataset.objects):
        tokens = dataset.tokens(obj, print).astype(np.int64)
        train, val = window_split(tokens.size, SEQ, 0.05)
        expected += [(ordinal << 32 | w, tokens[w * SEQ : w * SEQ + SEQ + 1]) for w in range(train, train + val)]
    expected = expected[:12]
    assert torch.cat([b.sample_ids for b in batches]).tolist() == [sample for sample, _ in expected]
    rows = torch.from_numpy(np.stack([row for _, row in expected]))
    assert torch.equal(torch.cat([b.inputs for b in batches]), rows[:, :-1])
    assert torch.equal(torch.cat([b.targets for b in batches]), rows[:, 1:])


def test_same_seed_gives_the_same_stream_and_another_seed_does_not(dataset):
    with (
        DataLoader(dataset, batch_size=5, seq_len=SEQ, seed=3) as a,
        DataLoader(dataset, batch_size=5, seq_len=SEQ, seed=3) as b,
        DataLoader(dataset, batch_size=5, seq_len=SEQ, seed=4) as c,
    ):
        first, second, other = _ids(a, 30), _ids(b, 30), _ids(c, 30)
    assert first == second
    assert first != other


def test_ranks_read_disjoint_windows_that_cover_the_epoch(dataset):
    world = 3
    seen = []
    for rank in range(world):
        with DataLoader(dataset, batch_size=1, seq_len=SEQ, seed=11, rank=rank, world=world) as loader:
            windows = _train_windows(loader.objects_of_epoch(0))
            ids = _ids(loader, windows)
            assert loader.state_dict()["epoch"] == 0
            assert len(set(ids)) == windows
            seen.append(set(ids))
    assert all(not (seen[i] & seen[j]) for i in range(world) for j in range(i + 1, world))
    everything = set().union(*seen)
    assert len(everything) == sum(window_split(n, SEQ, 0.05)[0] for n in OBJECT_TOKENS)


def test_next_epoch_reorders_the_windows(dataset):
    with DataLoader(dataset, batch_size=1, seq_len=SEQ, seed=11, rank=0, world=2) as loader:
        first = _ids(loader, _train_windows(loader.objects_of_epoch(0)))
        second = _ids(loader, 20)
        assert loader.state_dict()["epoch"] == 1
    assert second != first[:20]


@pytest.mark.parametrize("consumed", [1, 7, 26, 61])
def test_resume_from_a_saved_state_continues_with_the_exact_next_batch(dataset, consumed):
    with DataLoader(dataset, batch_size=6, seq_len=SEQ, seed=5, rank=1, world=2) as original:
        _ids(original, consumed)
        state = original.state_dict()
        expected = _ids(original, 40)
    with DataLoader(dataset, batch_size=6, seq_len=SEQ, seed=5, rank=1, world=2) as resumed:
        resumed.load_state_dict(state)
        assert _ids(resumed, 40) == expected
        assert resumed.samples == (consumed + 40) * 6


@pytest.mark.parametrize("skipped", [0, 1, 26, 61])
def test_seek_continues_as_if_the_skipped_batches_had_been_drawn(dataset, skipped):
    with DataLoader(dataset, batch_size=6, seq_len=SEQ, seed=5, rank=1, world=2) as original:
        for _ in range(skipped):
            original.next_batch()
        expected = _ids(original, 40)
    with DataLoader(dataset, batch_size=6, seq_len=SEQ, seed=5, rank=1, world=2) as sought:
        sought.seek(skipped)
        assert sought.samples == skipped * 6
        assert _ids(sought, 40) == expected


def test_state_of_another_run_is_refused(dataset):
    with DataLoader(dataset, batch_size=2, seq_len=SEQ, seed=5, rank=0, world=2) as loader:
        _ids(loader, 3)
        state = loader.state_dict()
    with (
        DataLoader(dataset, batch_size=2, seq_len=SEQ, seed=5, rank=0, world=3) as other,
        pytest.raises(DataError, match="state of another run: world=2 \\(now 3\\)"),
    ):
        other.load_state_dict(state)


def test_validation_windows_never_appear_in_training(dataset):
    validation = ValidationSet(dataset, batch_size=4, seq_len=SEQ).batches(5)
    again = ValidationSet(dataset, batch_size=4, seq_len=SEQ).batches(5)
    val_ids = set(torch.cat([b.sample_ids for b in validation]).tolist())
    assert val_ids == set(torch.cat([b.sample_ids for b in again]).tolist()) and len(val_ids) == 20
    train_ids = set()
    for rank in range(2):
        with DataLoader(dataset, batch_size=1, seq_len=SEQ, seed=2, rank=rank, world=2) as loader:
            train_ids |= set(_ids(loader, _train_windows(loader.objects_of_epoch(0))))
    assert not (val_ids & train_ids)


def test_fewer_objects_than_ranks_is_refused(dataset):
    with pytest.raises(DataError, match=f"dataset {dataset.uri} has 6 objects, fewer than the 8 data-parallel ranks"):
        DataLoader(dataset, batch_size=1, seq_len=SEQ, seed=1, rank=0, world=8)


def test_a_corrupt_shard_found_by_the_prefetch_thread_is_raised_to_the_trainer(dataset, tmp_path):
    for path in tmp_path.glob("*.tok"):
        data = bytearray(path.read_bytes())
        data[HEADER_SIZE + 3] ^= 0xFF
        path.write_bytes(data)
    with (
        DataLoader(dataset, batch_size=2, seq_len=SEQ, seed=1) as loader,
        pytest.raises(ShardChecksumError, match=r"shard file://.*shard-0000[0-5].tok: token checksum mismatch"),
    ):
        loader.next_batch()


def test_objects_too_short_for_a_window_are_reported(tmp_path):
    for index in range(2):
        (tmp_path / f"s{index}.tok").write_bytes(encode_shard(np.arange(5), dtype_for("uint16")))
    dataset = open_dataset(tmp_path.as_uri(), allowed_roots=[tmp_path])
    with (
        DataLoader(dataset, batch_size=2, seq_len=SEQ, seed=1) as loader,
        pytest.raises(DataError, match="objects hold no training window of 9 tokens"),
    ):
        loader.next_batch()


def test_first_pass_reports_progress_events(dataset):
    events = []
    with DataLoader(dataset, batch_size=1, seq_len=SEQ, seed=1, on_event=events.append) as loader:
        _ids(loader, _train_windows(loader.objects_of_epoch(0)) + 1)
    assert [(e.kind, e.message) for e in events] == [
        ("progress", f"{dataset.uri}: fetched 1/6 objects of rank 0"),
        ("progress", f"{dataset.uri}: fetched 6/6 objects of rank 0"),
    ]
