"""A batch of training windows and the ids of the samples it holds."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Batch:
    inputs: torch.Tensor  # (batch, seq_len) int64
    targets: torch.Tensor  # inputs shifted by one token
    sample_ids: torch.Tensor  # (batch,) int64: which windows these are (see the source of the batch)
