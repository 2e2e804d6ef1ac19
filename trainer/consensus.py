"""How a decentralized job's final average can fail, as the worker reports it.

The job's result is the workers' consensus (:func:`cantata.trainer.decentralized.consensus`).
A worker whose final all-reduce failed, or reached fewer than ``min_workers``
worker groups (the graph split), has no consensus to give: it raises
``ConsensusFailed``, which the worker reports as a permanent failure
(restarting it from a checkpoint cannot bring back peers that are done), so
the server ends the job FAILED with this reason instead of SUCCEEDED.
"""

from __future__ import annotations


class ConsensusFailed(RuntimeError):
    """This worker's final average failed or reached too few workers; the message names them and what failed."""
