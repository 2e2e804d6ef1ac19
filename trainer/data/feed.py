"""What a worker trains and validates on, whatever the dataset: a :class:`Feed`.

- ``builtin:pystdlib``: random windows of the in-memory corpus (:class:`CorpusFeed`);
- ``file://``, ``s3://`` and ``az://``: the streaming :class:`DataLoader` (:class:`StreamFeed`).

A feed hands out batches with their sample ids, and knows its position:
``state_dict()`` goes into every checkpoint, ``load_state_dict()`` continues
from one, and ``seek(n)`` moves to where ``n`` batches from the start would
have left it (for a worker that has no saved position of its own).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from cantata.trainer.data.batch import Batch
from cantata.trainer.data.corpus import BatchSampler, load_builtin_corpus
from cantata.trainer.data.errors import DataError, VocabularyError
from cantata.trainer.data.loader import DataEvent, DataLoader, ValidationSet
from cantata.trainer.data.sealing import DatasetKey
from cantata.trainer.data.sources import BUILTIN_PYSTDLIB, SourceCredentials, open_dataset
from cantata.trainer.data.text import Utf8Policy
from cantata.trainer.data.tokenizer import Vocabulary

VALIDATION_RANK = -1  # the corpus sampler's stream shared by every rank


@dataclass(frozen=True)
class DatasetAccess:
    """What a worker holds to open its job's dataset and its ``init_from`` weights (from its private config)."""

    roots: tuple[Path, ...] = ()  # where file:// datasets may live
    credentials: SourceCredentials | None = field(default=None, repr=False)
    dataset_key: DatasetKey | None = field(default=None, repr=False)
    init_credentials: SourceCredentials | None = field(default=None, repr=False)  # the init_from source's


class Feed(Protocol):
    @property
    def wait_seconds(self) -> float:
        """Time the trainer spent blocked on data."""

    def next_batch(self) -> Batch: ...

    def validation(self, count: int) -> list[Batch]: ...

    def check_validation(self, count: int, *, fetch: bool) -> None:
        """Raise a ``DataError`` now if ``count`` validation batches cannot be read.

        With ``fetch`` the batches are read (and kept); without, only what the
        listing shows is used, so no object is fetched twice.
        """

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def seek(self, batches: int) -> None: ...

    def close(self) -> None: ...


class CorpusFeed:
    """The built-in corpus: batch ``n`` of a rank is a pure function of (seed, rank, n)."""

    wait_seconds = 0.0

    def __init__(self, *, batch_size: int, seq_len: int, seed: int, rank: int) -> None:
        corpus = load_builtin_corpus()
        self._train = BatchSampler(corpus.train, batch_size, seq_len, seed, rank)
        self._val = BatchSampler(corpus.val, batch_size, seq_len, seed, VALIDATION_RANK)
        self._drawn = 0

    def next_batch(self) -> Batch:
        self._drawn += 1
        return self._train.batch(self._drawn)

    def validation(self, count: int) -> list[Batch]:
        return [self._val.batch(i) for i in range(count)]

    def check_validation(self, count: int, *, fetch: bool) -> None:
        self.validation(count)

    def state_dict(self) -> dict:
        return {"dataset": BUILTIN_PYSTDLIB, "batches": self._drawn}

    def load_state_dict(self, state: dict) -> None:
        if state.get("dataset") != BUILTIN_PYSTDLIB:
            raise DataError(f"cannot resume {BUILTIN_PYSTDLIB} from the position of {state.get('dataset')!r}")
        self._drawn = int(state["batches"])

    def seek(self, batches: int) -> None:
        self._drawn = batches

    def close(self) -> None:
        pass


class StreamFeed:
    """A tenant dataset streamed by the :class:`DataLoader`, with its validation split."""

    def __init__(self, loader: DataLoader, validation: ValidationSet, warn: Callable[[str], None]) -> None:
        self._loader, self._validation, self._warn = loader, validation, warn

    @property
    def wait_seconds(self) -> float:
        return self._loader.wait_seconds

    def next_batch(self) -> Batch:
        return self._loader.next_batch()

    def validation(self, count: int) -> list[Batch]:
        return self._validation.batches(count, self._warn)

    def check_validation(self, count: int, *, fetch: bool) -> None:
        if not fetch:
            self._validation.check_capacity(count)
            return
        try:
            self.validation(count)
        except DataError:
            self.next_batch()  # raises the loader's own error for a dataset with no training window
            raise

    def state_dict(self) -> dict:
        return self._loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self._loader.load_state_dict(state)

    def seek(self, batches: int) -> None:
        self._loader.seek(batches)

    def close(self) -> None:
        self._loader.close()


def open_feed(
    dataset: str,
    *,
    batch_size: int,
    seq_len: int,
    seed: int,
    rank: int,
    world: int,
    access: DatasetAccess,
    utf8_policy: Utf8Policy,
    on_event: Callable[[DataEvent], None],
    vocabulary: Vocabulary | None = None,
) -> Feed:
    """The feed of data-parallel ``rank`` of ``world`` (raises a ``DataError`` naming what is wrong).

    With a ``vocabulary`` every object read is checked against it (see :class:`Vocabulary`).
    """
    if dataset == BUILTIN_PYSTDLIB:
        if vocabulary is not None and vocabulary.tokenizer:
            raise VocabularyError(f"{dataset} is byte-level text, but the job names tokenizer {vocabulary.tokenizer}")
        return CorpusFeed(batch_size=batch_size, seq_len=seq_len, seed=seed, rank=rank)
    source = open_dataset(
        dataset,
        allowed_roots=access.roots,
        credentials=access.credentials,
        dataset_key=access.dataset_key,
        utf8_policy=utf8_policy,
        vocabulary=vocabulary,
    )
    loader = DataLoader(
        source, batch_size=batch_size, seq_len=seq_len, seed=seed, rank=rank, world=world, on_event=on_event
    )
    return StreamFeed(
        loader,
        ValidationSet(source, batch_size=batch_size, seq_len=seq_len),
        warn=lambda message: on_event(DataEvent("warning", message)),
    )
