"""User-style reward functions for the loop's tests (named as ``module:function``)."""


def length(prompt, completion, record):
    """Longer completions score higher: random policies get a reward spread to learn from."""
    return float(len(completion))


def raises(prompt, completion, record):
    raise KeyError("answer")


def not_a_number(prompt, completion, record):
    return float("nan")
