"""The model-family registry: a family registered once is built, compiled block by block and refused where it has
no form (sharding, Hugging Face) through the public paths, and the platform's vocabulary agrees with it."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from cantata.proto import codegen
from cantata.proto.vocabulary import BYTE_GPTS, Model, Shape
from cantata.trainer import models
from cantata.trainer.deferred_init import allocate, materialize
from cantata.trainer.hf import HFConfigError, check_config
from cantata.trainer.model import build_meta_model, build_model
from cantata.trainer.models import registry
from cantata.trainer.parallel import build_sharded
from cantata.trainer.regional_compile import blocks

ROOT = Path(__file__).resolve().parent.parent
FAMILY_CLASSES = {"GPT", "GPTConfig", "Decoder", "DecoderConfig"}


@dataclass(frozen=True)
class ToyConfig:
    width: int
    n_layer: int
    vocab_size: int
    block_size: int


class ToyLM(nn.Module):
    """An embedding, residual MLP blocks and a head: the smallest thing a family builds."""

    def __init__(self, cfg: ToyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.width)
        self.mlps = nn.ModuleList(nn.Linear(cfg.width, cfg.width) for _ in range(cfg.n_layer))
        self.head = nn.Linear(cfg.width, cfg.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        x = self.embed(idx)
        for mlp in self.mlps:
            x = x + torch.relu(mlp(x))
        logits = self.head(x)
        loss = None if targets is None else nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


def _config(shape: Mapping[str, Shape]) -> ToyConfig:
    return ToyConfig(**shape)  # type: ignore[arg-type]


def _blocks(model: nn.Module) -> nn.ModuleList:
    assert isinstance(model, ToyLM)
    return model.mlps


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> models.ModelFamily:
    monkeypatch.setattr(registry, "FAMILIES", dict(registry.FAMILIES))
    return models.register(
        models.ModelFamily(
            name="toy",
            title="a toy MLP",
            models={"toy-mlp": {"width": 8, "n_layer": 3, "vocab_size": 32, "block_size": 16}},
            config_type=ToyConfig,
            config=_config,
            module_type=ToyLM,
            build=ToyLM,
            blocks=_blocks,
        )
    )


def test_the_model_builder_builds_a_registered_family(toy: models.ModelFamily) -> None:
    model = build_model("toy-mlp", seed=3)
    assert isinstance(model, ToyLM) and model.cfg == ToyConfig(8, 3, 32, 16)
    again = build_model("toy-mlp", seed=3)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True))
    _, loss = model(torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long))
    assert loss is not None and torch.isfinite(loss)
    assert blocks(model) is model.mlps  # what regional compilation compiles, one block at a time

    meta, plan = build_meta_model("toy-mlp")  # deferred initialisation replays the family's construction
    allocate(meta)
    materialize(meta, plan, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(meta.state_dict().values(), model.state_dict().values(), strict=True))


def test_a_family_without_a_form_is_refused_by_name(toy: models.ModelFamily) -> None:
    with pytest.raises(ValueError, match="toy-mlp is a toy MLP, which cannot be sharded"):
        build_sharded("toy-mlp", 0, None, "fp32", False)  # type: ignore[arg-type]  # refused before the mesh is used
    with pytest.raises(HFConfigError, match="the job's model is a toy MLP"):
        check_config({"model_type": "llama"}, models.model_config("toy-mlp"), "config.json")


def test_names_register_once(toy: models.ModelFamily) -> None:
    with pytest.raises(ValueError, match="registered already"):
        models.register(toy)
    with pytest.raises(ValueError, match="belong to another family"):
        models.register(models.ModelFamily(**{**toy.__dict__, "name": "toy2"}))
    with pytest.raises(ValueError, match="unknown model"):
        models.family_of("toy-none")


def test_the_platform_vocabulary_agrees_with_the_registry() -> None:
    owners = {model: [f.name for f in models.FAMILIES.values() if model in f.models] for model in Model}
    assert all(len(names) == 1 for names in owners.values()), owners
    # the server refuses to shard BYTE_GPTS, the SDK to export them as Hugging Face folders
    assert {m for m in Model if models.family_of(m).tp_plan is None} == BYTE_GPTS
    assert {m for m in Model if models.family_of(m).hf_names is None} == BYTE_GPTS


def test_a_new_family_reaches_the_server_through_the_generated_catalog(toy: models.ModelFamily) -> None:
    """A family is one module of trainer/models/: the torch-free catalog the server and SDK read is generated."""
    catalog: dict[str, Any] = {}
    exec(compile(codegen.models_source(), "models.py", "exec"), catalog)  # the generated module
    assert catalog["Model"]("toy-mlp").name == "TOY_MLP"
    assert catalog["MODEL_SHAPES"][catalog["Model"].TOY_MLP] == {
        "width": 8,
        "n_layer": 3,
        "vocab_size": 32,
        "block_size": 16,
    }
    assert catalog["Model"].TOY_MLP in catalog["BYTE_GPTS"]  # neither sharded nor exported: as the byte GPTs
    assert [m.value for m in catalog["Model"]][: len(Model)] == [m.value for m in Model]  # the families before it


def test_only_the_families_test_their_classes() -> None:
    """No module outside the model families asks ``isinstance(x, Decoder)`` and the like: it asks the registry."""
    asked = []
    for path in sorted((ROOT / "trainer").rglob("*.py")):
        if path.parent.name == "models":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
                names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                if names & FAMILY_CLASSES:
                    asked.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not asked, f"ask cantata.trainer.models instead: {asked}"
