"""The lm-evaluation-harness adapter: exact causal log-likelihoods, the Monte-Carlo ELBOs
through the adapter (their values: test_likelihood.py), and lm-eval runs offline on local task
definitions over JSONL files the test writes."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from dlmkit.decoding.likelihood import causal_loglikelihood
from dlmkit.decoding.runner import Runner

from .helpers import TOK, prompt_ids, tiny_model

lm_eval = pytest.importorskip("lm_eval")


def test_causal_loglikelihood_is_exact():
    model = tiny_model()
    prompts = prompt_ids("rev abc", "x")
    with torch.no_grad():  # the greedy continuation of prompt 0, by the plain HF forward
        ids = list(prompts[0])
        for _ in range(3):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    greedy = ids[len(prompts[0]):]
    rows = [(prompts[0], greedy), (prompts[1], [97, 98]), (prompts[0], [greedy[0], 5])]
    got = causal_loglikelihood(Runner(model), rows, pad_id=TOK.pad_token_id)
    for (prompt, cont), (score, is_greedy) in zip(rows, got):
        seq = torch.tensor([list(prompt) + list(cont)])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=seq).logits[0].double(), -1)
        want = sum(float(logp[len(prompt) + i - 1, t]) for i, t in enumerate(cont))
        assert score == pytest.approx(want, abs=1e-4)
        assert is_greedy == (cont == greedy)
    assert [g for _, g in got] == [True, False, False]


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    def save(strategy, block_size=None):
        path = tmp_path_factory.mktemp(strategy)
        tiny_model().save_pretrained(path)
        TOK.save_pretrained(path)
        (path / "dlmkit.json").write_text(json.dumps({
            "strategy": strategy, "block_size": block_size, "task": None,
            "mask_token_id": TOK.mask_token_id, "options": {}, "max_new_tokens": 4}))
        return path

    return save


def write_tasks(root):
    """A generation task and a multiple-choice (log-likelihood) task over local JSONL."""
    data = root / "qa.jsonl"
    rows = [{"question": "rev ab", "answer": "ba", "choices": ["ba", "ab", "zz"], "label": 0},
            {"question": "sort 21", "answer": "12", "choices": ["21", "12"], "label": 1},
            {"question": "x", "answer": "y", "choices": ["y", "q"], "label": 0}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = (f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
              "test_split: test\ndoc_to_text: '{{question}}'\n")
    (root / "tiny_gen.yaml").write_text(
        "task: tiny_gen\n" + common + "output_type: generate_until\n"
        "doc_to_target: '{{answer}}'\ntarget_delimiter: ''\n"
        "generation_kwargs:\n  until: ['\\n']\n  max_gen_toks: 4\n"
        "metric_list:\n  - metric: exact_match\n")
    (root / "tiny_mc.yaml").write_text(
        "task: tiny_mc\n" + common + "output_type: multiple_choice\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{label}}'\ntarget_delimiter: ''\n"
        "metric_list:\n  - metric: acc\n")
    return rows


def evaluate(path, tasks, root, **model_args):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    import dlmkit.generate.harness  # noqa: F401  (registers the model)

    args = ",".join(f"{k}={v}" for k, v in {"pretrained": path, **model_args}.items())
    return simple_evaluate(model="dlmkit", model_args=args, tasks=tasks,
                           task_manager=TaskManager(include_path=str(root)), log_samples=True,
                           bootstrap_iters=0)


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.mark.slow
def test_lm_eval_generation_and_loglikelihood_on_a_local_task(export, tmp_path, offline):
    from dlmkit.generate.harness import DlmkitLM

    rows = write_tasks(tmp_path)
    path = export("ar")
    out = evaluate(path, ["tiny_gen", "tiny_mc"], tmp_path, batch_size=2)
    lm = DlmkitLM(pretrained=str(path))
    # Generation: the adapter's answers are the model's own sampler outputs.
    gen = out["samples"]["tiny_gen"]
    requests = [SimpleNamespace(args=(r["question"], {"until": ["\n"], "max_gen_toks": 4}))
                for r in rows]
    texts = lm.generate_until(requests)
    assert [s["resps"][0][0] for s in sorted(gen, key=lambda s: s["doc_id"])] == texts
    hits = sum(t.strip() == r["answer"] for t, r in zip(texts, rows))
    assert out["results"]["tiny_gen"]["exact_match,none"] == pytest.approx(hits / len(rows))
    # Log-likelihood: lm-eval's accuracy is the argmax of the adapter's exact scores.
    picks = []
    for row in rows:
        scores = lm.loglikelihood([SimpleNamespace(args=(row["question"], c))
                                   for c in row["choices"]])
        assert all(s < 0 for s, _ in scores)
        picks.append(max(range(len(scores)), key=lambda i: scores[i][0]) == row["label"])
    assert out["results"]["tiny_mc"]["acc,none"] == pytest.approx(sum(picks) / len(rows))


@pytest.mark.slow
def test_lm_eval_masked_diffusion_elbo_and_unanswerable_family(export, tmp_path, offline,
                                                              monkeypatch):
    write_tasks(tmp_path)
    for family in ("mdlm", "scdd"):  # scdd: over the non-mask tokens
        out = evaluate(export(family), ["tiny_mc"], tmp_path, mc_samples=4, batch_size=4)
        scores = [s["resps"][0][0][0] for s in out["samples"]["tiny_mc"]]
        assert all(math.isfinite(s) and s < 0 for s in scores)
    out = evaluate(export("bd3lm", 4), ["tiny_mc"], tmp_path, mc_samples=4, batch_size=4)
    assert all(math.isfinite(s["resps"][0][0][0]) for s in out["samples"]["tiny_mc"])
    # A family without a scorer (as bd3lm was before block_elbo) gets a clear error.
    import dataclasses

    from dlmkit import families

    monkeypatch.setitem(families._REGISTRY, "bd3lm",
                        dataclasses.replace(families.get("bd3lm"), likelihood=None))
    with pytest.raises(ValueError, match=r"strategy 'bd3lm' cannot score a continuation; "
                                         r"families that can: .*ar.* \(exact\), mdlm, scdd "
                                         r"\(Monte-Carlo ELBO\)"):
        evaluate(export("bd3lm", 4), ["tiny_mc"], tmp_path)


def test_bad_model_args(export):
    from dlmkit.generate.harness import DlmkitLM

    path = str(export("ar"))
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['stepz'\]; valid: pretrained"):
        DlmkitLM(pretrained=path, stepz=3)
    with pytest.raises(ValueError, match="mc_samples must be an int >= 1"):
        DlmkitLM(pretrained=path, mc_samples=0)
    if not torch.cuda.is_available():  # lm-eval's own default device is cuda:0
        with pytest.raises(ValueError, match="device 'cuda:0' but torch has no CUDA"):
            DlmkitLM(pretrained=path, device="cuda:0")
    lm = DlmkitLM(pretrained=path)
    with pytest.raises(ValueError, match="loglikelihood_rolling .* not supported"):
        lm.loglikelihood_rolling([])


@pytest.mark.slow
def test_dlmkit_lm_eval_command(export, tmp_path):
    """`dlmkit lm-eval` is lm-eval's command line with `--model dlmkit` registered."""
    import os
    import subprocess
    import sys

    write_tasks(tmp_path)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "dlmkit.cli", "lm-eval", "--model", "dlmkit", "--model_args",
           f"pretrained={export('ar')}", "--tasks", "tiny_mc", "--include_path", str(tmp_path),
           "--output_path", str(tmp_path / "out")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tiny_mc" in done.stdout and "acc" in done.stdout
    (result,) = (tmp_path / "out").rglob("results_*.json")
    assert "acc,none" in json.loads(result.read_text())["results"]["tiny_mc"]
