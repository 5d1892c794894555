"""Each family's training options are a typed dataclass with help per field, and one checker
validates every option from the annotations and the field metadata."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from dlmkit import families
from dlmkit.families import Family, Strategy
from dlmkit.families.options import TrainingOptions, check, defaults, option
from dlmkit.families.scdd.strategy import SCDDStrategy

DOCS = Path(__file__).resolve().parents[2] / "docs" / "families"
BUILT_IN = ("mdlm", "scdd", "hybrid", "idlm", "bd3lm", "ar", "dflash", "block_diffusion")
# Each family's options and defaults as the plain dicts of the strategies held them before the
# options became dataclasses: config.yaml and dlmkit.json of existing runs record these keys.
FORMER_DICTS = {
    "mdlm": {"t_min": 0.2, "t_max": 1.0, "time_sampling": "stratified", "logit_shift": None},
    "scdd": {"num_timesteps": 1000, "max_ratio": 0.1, "gamma_shape": 1.0, "t_peak": 0.5,
             "t_min": 0.2, "time_sampling": "stratified", "logit_shift": None},
    "hybrid": {"block_size": 4, "alpha": 1.0, "corruption": "uniform", "t_min": 0.2,
               "t_max": 1.0, "time_sampling": "stratified", "half_life_ratio": 0.25},
    # clean_loss_weight: null since the regime decides it (from scratch 1.0, the former default;
    # a config.yaml without the key resumes with it: dlmkit.train.resume)
    "idlm": {"block_size": 4, "clean_loss_weight": None, "auto_balance": False},
    "bd3lm": {"block_size": 4, "t_min": 0.2, "t_max": 1.0, "time_sampling": "stratified",
              "logit_shift": None},
    "ar": {},
    "dflash": {"target": None, "target_layer_ids": None, "num_target_layers": 3,
               "block_size": 8, "num_blocks_per_sample": 4, "overlap": True, "gamma": None,
               "normalize": "tokens", "min_supervised": None},
    "block_diffusion": {"block_size": 4, "eps": 1e-3, "self_conditioning_p": 0.5,
                        "encoder_loss_weight": 1.0, "encoder_loss_targets": "response",
                        "max_blocks": None, "decode": "selected"},
}


def test_every_built_in_family_is_covered():
    assert set(BUILT_IN) <= set(families.names())
    assert set(FORMER_DICTS) == set(BUILT_IN)


@pytest.mark.parametrize("name", BUILT_IN)
def test_training_options_are_a_documented_dataclass(name):
    family = families.get(name)
    cls = family.training
    assert cls is family.strategy.options
    assert dataclasses.is_dataclass(cls) and issubclass(cls, TrainingOptions)
    assert cls.__dataclass_params__.frozen
    for f in dataclasses.fields(cls):
        assert len(f.metadata.get("help", "")) >= 15, f"{cls.__name__}.{f.name} has no help"
        nullable = "None" in str(f.type)
        # a nullable option says what null means (it is printed in the errors and the help)
        assert ("null" in f.metadata) == nullable, f"{cls.__name__}.{f.name}"
    check(cls, defaults(cls), family=name)  # every default passes its own field


@pytest.mark.parametrize("name", BUILT_IN)
def test_same_keys_and_defaults_as_the_former_dicts(name):
    strategy = families.get(name).strategy
    assert strategy.defaults() == FORMER_DICTS[name]
    assert list(strategy.defaults()) == list(FORMER_DICTS[name])  # config.yaml's order
    # the options class still reads as that dict (dlmkit.train.resume, --print-config)
    assert {**strategy.options} == FORMER_DICTS[name]
    assert dict(strategy.options.items()) == FORMER_DICTS[name]
    assert sorted(strategy.options) == sorted(FORMER_DICTS[name])
    assert all(key in strategy.options for key in FORMER_DICTS[name])
    assert "no_such_option" not in strategy.options


def _read_keys(cls) -> set[str]:
    """Option keys the strategy modules of ``cls``'s MRO read: ``self.config["k"]``,
    ``c["k"]`` (``c = self.config``) and ``self.config.get("k")``."""
    keys = set()
    modules = {inspect.getsourcefile(k) for k in cls.__mro__ if issubclass(k, Strategy)}
    for path in modules:
        for node in ast.walk(ast.parse(Path(path).read_text())):
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                target = node.value
                if (isinstance(target, ast.Attribute) and target.attr == "config") or \
                        (isinstance(target, ast.Name) and target.id == "c"):
                    keys.add(node.slice.value)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "get" and isinstance(node.func.value, ast.Attribute)
                  and node.func.value.attr == "config" and node.args
                  and isinstance(node.args[0], ast.Constant)):
                keys.add(node.args[0].value)
    return keys


@pytest.mark.parametrize("name", BUILT_IN)
def test_fields_match_what_the_strategy_reads(name):
    """No dead option (a field its strategy never reads), no option read without a field
    (outside the base class's shared helpers, which only the families with the option call)."""
    strategy = families.get(name).strategy
    fields = {f.name for f in dataclasses.fields(strategy.options)}
    assert fields <= _read_keys(strategy)
    own = _read_keys(strategy) - _read_keys(Strategy)
    assert own <= fields


# -- the checker on hand-written cases -------------------------------------------------------
@dataclass(frozen=True)
class Toy(TrainingOptions):
    count: int = option(3, "a count of things", positive=True)
    limit: int | None = option(None, "a limit on things", positive=True, null="no limit")
    size: int = option(8, "a size of at least two", low=2)
    rate: float = option(0.5, "a rate strictly inside", low=0, high=1, ends="()")
    share: float = option(0.5, "a share, ends included", low=0, high=1, ends="[]")
    floor: float = option(0.0, "from zero, one excluded", low=0, high=1, ends="[)")
    top: float = option(1.0, "to one, zero excluded", low=0, high=1, ends="(]")
    weight: float = option(1.0, "a weight from zero up", low=0)
    scale: float | None = option(None, "a positive scale", positive=True, null="auto")
    mode: str = option("a", "one of two modes", choices=("a", "b"))
    flag: bool = option(True, "a switch, on or off")
    shift: bool | None = option(None, "a switch with an automatic setting", null="automatic")
    ids: list[int] | None = option(None, "some layer ids", null="all of them")
    path: str | None = option(None, "a directory", null="none")


def _error(key, value) -> str | None:
    try:
        check(Toy, {key: value}, family="toy")
    except ValueError as err:
        return str(err)
    return None


ACCEPTED = [
    ("count", 1), ("limit", None), ("limit", 7), ("size", 2),
    ("rate", 1e-9), ("rate", 0.999), ("share", 0), ("share", 1), ("share", 1.0),
    ("floor", 0), ("floor", 0.999), ("top", 1), ("top", 1e-9),
    ("weight", 0), ("weight", 2), ("weight", 1e9), ("scale", None), ("scale", 0.5), ("scale", 3),
    ("mode", "b"), ("flag", False), ("shift", None), ("shift", True),
    ("ids", [0, 2]), ("ids", (1,)), ("ids", None), ("path", "/a/b"), ("path", None),
]


@pytest.mark.parametrize("key,value", ACCEPTED)
def test_the_checker_accepts(key, value):
    assert _error(key, value) is None


REJECTED = [
    # a bool is not an int, nor a float
    ("count", True, "strategy.count must be a positive int, got True"),
    ("count", 0, "strategy.count must be a positive int, got 0"),
    ("count", 2.0, "strategy.count must be a positive int, got 2.0"),
    ("count", None, "strategy.count must be a positive int, got None"),
    ("limit", 0, "strategy.limit must be a positive int or null (no limit), got 0"),
    ("size", 1, "strategy.size must be an int >= 2, got 1"),
    ("rate", 0, "strategy.rate must be a number in (0, 1), got 0"),
    ("rate", 1.0, "strategy.rate must be a number in (0, 1), got 1.0"),
    ("rate", False, "strategy.rate must be a number in (0, 1), got False"),
    ("rate", "0.5", "strategy.rate must be a number in (0, 1), got '0.5'"),
    ("share", -1e-9, "strategy.share must be a number in [0, 1], got -1e-09"),
    ("share", 1.0000001, "strategy.share must be a number in [0, 1], got 1.0000001"),
    ("floor", 1, "strategy.floor must be a number in [0, 1), got 1"),
    ("top", 0.0, "strategy.top must be a number in (0, 1], got 0.0"),
    ("weight", -0.5, "strategy.weight must be a finite number >= 0, got -0.5"),
    ("weight", math.inf, "strategy.weight must be a finite number >= 0, got inf"),
    ("weight", math.nan, "strategy.weight must be a finite number >= 0, got nan"),
    ("weight", True, "strategy.weight must be a finite number >= 0, got True"),
    ("scale", 0, "strategy.scale must be a finite number > 0 or null (auto), got 0"),
    ("mode", "c", "strategy.mode must be one of ('a', 'b'), got 'c'"),
    ("mode", None, "strategy.mode must be one of ('a', 'b'), got None"),
    ("flag", 1, "strategy.flag must be true or false, got 1"),
    ("flag", None, "strategy.flag must be true or false, got None"),
    ("shift", "yes", "strategy.shift must be true, false or null (automatic), got 'yes'"),
    ("ids", [], "strategy.ids must be a non-empty list of ints or null (all of them), got []"),
    ("ids", [0, True], "strategy.ids must be a non-empty list of ints or null (all of them), "
                       "got [0, True]"),
    ("ids", 3, "strategy.ids must be a non-empty list of ints or null (all of them), got 3"),
    ("path", 3, "strategy.path must be a string or null (none), got 3"),
]


@pytest.mark.parametrize("key,value,message", REJECTED)
def test_the_checker_rejects_naming_the_option_the_value_and_what_is_allowed(key, value,
                                                                               message):
    assert _error(key, value) == message


def test_unknown_options_are_listed_with_the_valid_ones():
    with pytest.raises(ValueError) as err:
        check(Toy, {"cuont": 1, "count": 2}, family="toy")
    assert str(err.value) == (f"strategy 'toy': unknown option(s) ['cuont']; valid: "
                              f"{sorted(f.name for f in dataclasses.fields(Toy))}")


def test_an_option_default_must_be_immutable():
    with pytest.raises(TypeError, match=r"option default must be immutable .* got \[1\]"):
        option([1], "a list default")


# -- through the strategies --------------------------------------------------------------------
def _make(name, **options):
    return families.get(name).strategy(options, mask_token_id=3, vocab_size=16)


@pytest.mark.parametrize("name,options,message", [
    ("block_diffusion", {"eps": 1.0}, "strategy.eps must be a number in (0.0, 1.0), got 1.0"),
    ("block_diffusion", {"self_conditioning_p": 1.5},
     "strategy.self_conditioning_p must be a number in [0.0, 1.0], got 1.5"),
    ("block_diffusion", {"max_blocks": 0},
     "strategy.max_blocks must be a positive int or null (no limit), got 0"),
    ("block_diffusion", {"encoder_loss_weight": math.inf},
     "strategy.encoder_loss_weight must be a finite number >= 0, got inf"),
    ("mdlm", {"logit_shift": "yes"}, "strategy.logit_shift must be true, false or null (true "
                                     "when fine-tuning a causal checkpoint (any without the "
                                     "option), false from scratch; an export with it keeps its "
                                     "own), got 'yes'"),
    ("idlm", {"clean_loss_weight": -1}, "strategy.clean_loss_weight must be a finite number >= "
                                        "0 or null (4.0 when fine-tuning a causal checkpoint (any "
                                        "without the option), 1.0 from scratch; an export with "
                                        "it keeps its own), got -1"),
    ("mdlm", {"t_min": 0}, "strategy.t_min must be a number in (0, 1), got 0"),
    ("mdlm", {"t_min": 0.6, "t_max": 0.5}, "strategy.t_min and strategy.t_max must satisfy "
                                           "0 < t_min < t_max <= 1, got t_min=0.6, t_max=0.5"),
    ("scdd", {"t_min": 1.0}, "strategy.t_min must be a number in [0, 1), got 1.0"),
    ("scdd", {"num_timesteps": 1}, "strategy.num_timesteps must be an int >= 2, got 1"),
    ("hybrid", {"corruption": "random"},
     "strategy.corruption must be one of ('uniform', 'blockwise'), got 'random'"),
    ("hybrid", {"block_size": True}, "strategy.block_size must be a positive int, got True"),
    ("idlm", {"auto_balance": "no"}, "strategy.auto_balance must be true or false, got 'no'"),
    ("bd3lm", {"time_sampling": "sobol"},
     "strategy.time_sampling must be one of ('stratified', 'iid'), got 'sobol'"),
    ("dflash", {"block_size": 1}, "strategy.block_size must be an int >= 2, got 1"),
    ("ar", {"block_size": 4}, "strategy 'ar': unknown option(s) ['block_size']; valid: none"),
])
def test_strategies_reject_bad_options(name, options, message):
    with pytest.raises(ValueError) as err:
        _make(name, **options)
    assert str(err.value) == message


def test_an_int_is_a_number_and_values_are_recorded_as_given():
    strategy = _make("block_diffusion", self_conditioning_p=1, encoder_loss_weight=0)
    assert strategy.config["self_conditioning_p"] == 1 and strategy.config["max_blocks"] is None
    assert strategy.config == {**FORMER_DICTS["block_diffusion"], "self_conditioning_p": 1,
                               "encoder_loss_weight": 0}


def test_a_strategy_with_untyped_options_keeps_working():
    """A family written before the options were typed (a dict of defaults): unknown keys are
    still rejected, the values are its validate()'s to check."""

    class Legacy(SCDDStrategy):
        options = {**FORMER_DICTS["scdd"], "t_min": 0.5}

    assert Legacy.defaults()["t_min"] == 0.5
    assert _legacy_config(Legacy)["t_min"] == 0.5
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['t_mni'\]; valid: "):
        Legacy({"t_mni": 0.1}, mask_token_id=3, vocab_size=16)


def _legacy_config(cls):
    return cls({}, mask_token_id=3, vocab_size=16).config


# -- the registry ------------------------------------------------------------------------------
def test_a_family_record_takes_its_strategys_options():
    mdlm = families.get("mdlm")
    bare = Family(name="mdlm", paper="p", trains="t", strategy=mdlm.strategy,
                  sampling=mdlm.sampling, decode=mdlm.decode)
    assert bare.training is mdlm.strategy.options
    with pytest.raises(RuntimeError, match="training options"):
        Family(name="mdlm", paper="p", trains="t", strategy=mdlm.strategy,
               sampling=mdlm.sampling, decode=mdlm.decode,
               training=families.get("scdd").training)


@pytest.mark.parametrize("name", BUILT_IN)
def test_training_help_lists_every_option_with_its_default_and_help(name):
    text = families.training_help(name)
    cls = families.get(name).training
    assert text.startswith(f"strategy.<option> of {name}")
    flat = " ".join(text.split())
    for f in dataclasses.fields(cls):
        assert f"{f.name} = {f.default!r}" in flat
        assert " ".join(f.metadata["help"].split()) in flat
    if not dataclasses.fields(cls):
        assert text == f"strategy.<option> of {name}: none"


def test_training_help_of_an_unknown_family():
    with pytest.raises(ValueError, match="unknown strategy 'mdml'"):
        families.training_help("mdml")


@pytest.mark.parametrize("name", BUILT_IN)
def test_the_family_page_lists_exactly_its_training_options(name):
    """docs/families/<name>.md's "Training options" table names every field and no other."""
    text = (DOCS / f"{name}.md").read_text()
    section = text.split("## Training options", 1)[1].split("\n## ", 1)[0]
    listed = {m for row in section.splitlines() if row.startswith("| `")
              for m in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert listed == {f.name for f in dataclasses.fields(families.get(name).training)}
