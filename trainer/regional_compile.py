"""Regional compilation: ``torch.compile`` of each transformer block, as torchtitan's ``apply_compile`` does.

The blocks of a model share one code path, so Dynamo traces it once and
every block reuses the graph (parameters are graph inputs), where compiling
the whole model would trace every layer and break at the embedding and loss.
Each block is compiled in place (``nn.Module.compile``), so parameter names,
checkpoints and optimizer routing stay as they are. On a mesh it runs after
tensor parallelism and activation checkpointing and before ``fully_shard``
(:func:`cantata.trainer.parallel.parallelize`), so FSDP2's hooks stay
outside the compiled graphs.
"""

from __future__ import annotations

from torch import nn

from cantata.trainer.models import family_of_module


def blocks(model: nn.Module) -> nn.ModuleList:
    """The repeated transformer blocks, as the model's family names them."""
    return family_of_module(model).blocks(model)


def compile_blocks(model: nn.Module) -> None:
    """Compile each of ``model``'s blocks in place with inductor, one whole graph each (``fullgraph``)."""
    for block in blocks(model):
        block.compile(fullgraph=True)
