"""The strategy interface: a family owns its model(s), its sampler and its export fields; the
recipe and the samplers take all of that from the strategy, never from a family name."""

from __future__ import annotations

import dataclasses
import json
from typing import ClassVar

import pytest
import torch

from dlmkit import families, strategies
from dlmkit.families.mdlm.options import MDLMSampling
from dlmkit.families.mdlm.strategy import MDLMStrategy
from dlmkit.generate import SAMPLERS, load
from dlmkit.generate.api import decoders
from dlmkit.train.distributed import World
from dlmkit.train.recipe import build_components
from tests.train.helpers import config

CPU = World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


@pytest.mark.parametrize("name", strategies.names())
def test_every_family_record_holds_its_strategy_decoder_and_options(name):
    family = families.get(name)
    assert strategies.get(name) is family.strategy and family.strategy.name == name
    assert name in SAMPLERS and decoders()[name] is family.decode
    assert family.sampling.sampler == name


class _Probe(MDLMStrategy):
    """An MDLM variant that records which interface hooks the recipe called."""

    name = "probe"
    calls: list = []

    def build_model(self, spec, **kwargs):
        self.calls.append(("build_model", spec))
        return super().build_model(spec, **kwargs)

    def setup(self, device):
        self.calls.append(("setup", device.type))
        self.frozen = torch.nn.Linear(2, 2).requires_grad_(False)

    def export_meta(self):
        return {"probe": "exported"}


@dataclasses.dataclass(frozen=True)
class _ProbeSampling(MDLMSampling):
    sampler: ClassVar[str] = "probe"


def test_recipe_builds_the_model_through_the_strategy(monkeypatch, tmp_path):
    mdlm = families.get("mdlm")
    monkeypatch.setitem(families._REGISTRY, "probe", dataclasses.replace(
        mdlm, name="probe", strategy=_Probe, sampling=_ProbeSampling))
    _Probe.calls = []
    cfg = config("strategy.name=probe", "train.steps=1", strategy="mdlm",
                 output_dir=tmp_path / "run")
    cfg["strategy"]["name"] = "probe"
    c = build_components(cfg, CPU)
    # model.name unset -> the strategy's own preset; setup ran after the model was built
    assert _Probe.calls == [("build_model", _Probe.default_model), ("setup", "cpu")]
    # the auxiliary model is not trained
    params = {id(p) for group in c.optimizer.param_groups for p in group["params"]}
    assert not any(id(p) in params for p in c.strategy.frozen.parameters())

    from dlmkit.train import recipe

    recipe.run(cfg)
    meta = json.loads((tmp_path / "run" / "final" / "dlmkit.json").read_text())
    assert meta["strategy"] == "probe" and meta["probe"] == "exported"
    # the export decodes with its family's own sampler, with the options the registry names
    assert load(tmp_path / "run" / "final").config().sampler == "probe"


def test_plain_model_directory_needs_an_explicit_sampler(tmp_path):
    from dlmkit.data import load_tokenizer
    from dlmkit.models import build_model

    tokenizer = load_tokenizer("byte")
    model = build_model("tiny-llama", tokenizer.vocab_size, attention="sdpa",
                        overrides={"num_hidden_layers": 1})
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = load(tmp_path)
    with pytest.raises(ValueError, match="no dlmkit.json.*--sampler"):
        loaded.config()
    assert loaded.config("ar").sampler == "ar"
