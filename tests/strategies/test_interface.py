"""The strategy interface: a family owns its model(s), its sampler and its export fields; the
recipe and the samplers take all of that from the strategy, never from a family name."""

from __future__ import annotations

import json

import pytest
import torch

from dlmkit import strategies
from dlmkit.generate import SAMPLERS, load
from dlmkit.generate.api import DECODERS, strategy_samplers
from dlmkit.strategies.mdlm import MDLMStrategy
from dlmkit.train.distributed import World
from dlmkit.train.recipe import build_components
from tests.train.helpers import config

CPU = World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


@pytest.mark.parametrize("name", strategies.names())
def test_every_strategy_names_a_sampler_that_exists(name):
    sampler = strategies.get(name).sampler
    assert sampler in SAMPLERS and sampler in DECODERS, (name, sampler)
    assert strategy_samplers()[name] == sampler


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


def test_recipe_builds_the_model_through_the_strategy(monkeypatch, tmp_path):
    monkeypatch.setitem(strategies._REGISTRY, "probe", _Probe)
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
    assert load(tmp_path / "run" / "final").config().sampler == "mdlm"


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
