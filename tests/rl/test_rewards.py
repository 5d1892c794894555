"""The bundled rewards, resolving ``module:function``, and the errors of a failing reward."""

from __future__ import annotations

import pytest

from dlmkit.rl.rewards import RewardError, resolve_reward, score

RECORD = {"prompt": "47+85=", "response": "132"}


def test_bundled_rewards():
    exact, numeric = resolve_reward("exact_answer"), resolve_reward("numeric_answer")
    assert exact("47+85=", " 132 ", RECORD) == 1.0
    assert exact("47+85=", "131", RECORD) == 0.0
    assert numeric("q", "so the sum is 132.0", RECORD) == 1.0
    assert numeric("q", "12 then 13", RECORD) == 0.0
    assert numeric("q", "no digits", RECORD) == 0.0
    number = resolve_reward("format")
    assert number("q", " -4.5 ", RECORD) == 1.0 and number("q", "4 5", RECORD) == 0.0
    tagged = resolve_reward("format", r"<answer>\d+</answer>")
    assert tagged("q", "<answer>7</answer>", RECORD) == 1.0
    assert tagged("q", "7", RECORD) == 0.0


def test_resolve_errors_name_the_spec():
    with pytest.raises(ValueError, match=r"cannot import module 'no_such_module_x'"):
        resolve_reward("no_such_module_x:f")
    with pytest.raises(ValueError, match=r"module 'tests.rl.reward_helpers' has no function "
                                         r"'missing'"):
        resolve_reward("tests.rl.reward_helpers:missing")
    with pytest.raises(ValueError, match=r"reward.pattern '\(' is not a valid regular"):
        resolve_reward("format", "(")


def test_score_errors_name_function_and_prompt():
    def text(prompt, completion, record):
        return "1.0"

    where = "prompt 3 ('47+85=')"
    with pytest.raises(RewardError, match=r"test_rewards:.*text returned '1.0' \(str\), not a "
                                          r"number, on prompt 3 \('47\+85='\)"):
        score(text, "47+85=", "132", RECORD, where=where)
    with pytest.raises(RewardError, match=r"returned inf on prompt 3"):
        score(lambda p, c, r: float("inf"), "47+85=", "132", RECORD, where=where)
    assert score(lambda p, c, r: True, "47+85=", "132", RECORD, where=where) == 1.0
