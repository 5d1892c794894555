"""data.max_seq_len never cuts silently.

Before: records longer than the cap were cut without a word; with every answer beyond the cap
the run "succeeded" at loss 0, trained on nothing. Now the cut is counted and reported before
training, a record left without supervised tokens is an error by default
(``data.truncation``: error / drop / truncate), and zero supervised tokens never start a run.
"""

from __future__ import annotations

import json

import pytest
import torch

from dlmkit.cli import main
from dlmkit.data import ByteTokenizer, Collator, SFTDataset
from dlmkit.train.config import ConfigError
from dlmkit.train.truncation import apply_length_cap

from .helpers import cli_args, losses

# With the byte tokenizer's chat template: LONG is 53 tokens, its 9 supervised ones (response +
# EOS) at 44..52; SHORT is 17 tokens.
LONG = {"prompt": "p" * 40, "response": "r" * 8}
SHORT = {"prompt": "p" * 4, "response": "r" * 8}


def data_file(tmp_path, rows):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_args(tmp_path, path, *extra):
    return cli_args(tmp_path / "run", "data.task=null", f"data.train_files=[{path}]",
                    "train.steps=1", *extra)


def test_whole_response_cut_is_an_error_naming_records(tmp_path):
    path = data_file(tmp_path, [LONG, SHORT] * 8)
    with pytest.raises(SystemExit, match=r"data.max_seq_len=40 cuts the whole response of 8 of "
                                         r"16 training records \(e.g. .*train.jsonl:1, "
                                         r".*train.jsonl:3.*longest record has 53 tokens\), "
                                         r".*data.truncation=drop"):
        main(run_args(tmp_path, path, "data.max_seq_len=40"))
    assert not (tmp_path / "run").exists()  # before anything is written


def test_partial_cut_is_reported_before_training(tmp_path, capsys):
    path = data_file(tmp_path, [LONG, SHORT] * 8)
    main(run_args(tmp_path, path, "data.max_seq_len=48"))
    out = capsys.readouterr().out
    # 8 long records keep 4 of their 9 supervised tokens: 40 of 144 lost
    assert ("data: data.max_seq_len=48 cuts 8 of 16 training records; 40 of 144 supervised "
            "tokens lost (27.8%)") in out
    assert out.index("data:") < out.index("run directory:")


def test_drop_policy_leaves_out_long_records(tmp_path, capsys):
    path = data_file(tmp_path, [LONG, SHORT] * 8)
    main(run_args(tmp_path, path, "data.max_seq_len=40", "data.truncation=drop"))
    assert ("data: data.max_seq_len=40: dropped the 8 of 16 training records it cuts "
            "(data.truncation=drop), 72 of 144 supervised tokens with them (50.0%)"
            ) in capsys.readouterr().out
    assert len(losses(tmp_path / "run")) == 1


def test_truncate_policy_keeps_records_and_says_how_many_are_empty(tmp_path, capsys):
    path = data_file(tmp_path, [LONG, SHORT] * 8)
    main(run_args(tmp_path, path, "data.max_seq_len=40", "data.truncation=truncate"))
    assert "8 records keep no supervised token" in capsys.readouterr().out


@pytest.mark.parametrize("policy", ["truncate", "drop"])
def test_no_supervised_token_left_never_starts(tmp_path, policy):
    path = data_file(tmp_path, [LONG] * 8)
    with pytest.raises(SystemExit, match="no supervised token is left|leaves no training record"):
        main(run_args(tmp_path, path, "data.max_seq_len=40", f"data.truncation={policy}"))
    assert not (tmp_path / "run").exists()


def test_counts_match_a_brute_force_cut():
    tokenizer = ByteTokenizer()
    rows = [{"prompt": "p" * n, "response": "r" * m} for n, m in [(3, 2), (30, 9), (12, 20),
                                                                   (50, 1), (0, 40)]]
    dataset = SFTDataset(rows, tokenizer)
    for cap in (10, 25, 47, 200):
        collator = Collator(pad_token_id=tokenizer.pad_token_id, max_seq_len=cap)
        kept, report = apply_length_cap(dataset, collator, "truncate", "training", cap)
        masks = [dataset[i]["loss_mask"] for i in range(len(dataset))]
        assert report.cut == sum(len(m) > cap for m in masks)
        assert report.lost == sum(int(m[cap:].sum()) for m in masks)
        assert report.emptied == sum(len(m) > cap and int(m[:cap].sum()) == 0 for m in masks)
        assert len(kept) == len(dataset)
    with pytest.raises(ConfigError, match="data.truncation=truncate"):
        apply_length_cap(dataset, Collator(pad_token_id=tokenizer.pad_token_id, max_seq_len=10),
                         "error", "training", 10)


def test_subset_keeps_the_selected_records():
    tokenizer = ByteTokenizer()
    dataset = SFTDataset([{"prompt": "a" * n, "response": "b"} for n in (1, 5, 9)], tokenizer)
    sub = dataset.subset([2, 0])
    assert len(sub) == 2 and sub[0]["sample_index"] == 0
    assert sub[0]["input_ids"].tolist() == dataset[2]["input_ids"].tolist()
    assert sub[1]["loss_mask"].tolist() == dataset[0]["loss_mask"].tolist()
    assert sub.sources == [dataset.sources[2], dataset.sources[0]]


# block_diffusion's blocks start at the response: under the cap the collator keeps only the
# response's whole blocks, so a response starting less than a block before the cap keeps
# nothing. On the bundled `reverse` task (64 records, byte tokenizer, prompts of 11-13 tokens)
# a cap of 16 with blocks of 4 used to be reported as "cuts 62 of 64, 178 of 376 supervised
# tokens lost, none emptied" while the rows held no supervised token for 58 records.


def block_diffusion_components(cap, *extra):
    from dlmkit.train.distributed import World
    from dlmkit.train.recipe import build_components

    from .helpers import config

    cpu = World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    return build_components(config(f"data.max_seq_len={cap}", *extra,
                                   strategy="block_diffusion"), cpu)


def collated(c):
    """(rows without a supervised token, supervised record tokens not in the rows, rows cut),
    counted from the rows the run's collator makes of the whole training set."""
    batch = c.collator([c.train_set[i] for i in range(len(c.train_set))])
    content = torch.arange(batch["loss_mask"].shape[1])[None, :] < batch["lengths"][:, None]
    kept = int((batch["loss_mask"] * content).sum())
    return (int((batch["loss_mask"].sum(1) == 0).sum()),
            c.train_set.num_supervised_tokens - kept, int(batch["truncated"].sum()))


def test_block_diffusion_report_counts_what_the_collator_trains():
    c = block_diffusion_components(16, "data.truncation=truncate")
    report = c.cap_reports[0]
    assert (report.records, report.supervised) == (64, 376)
    assert (report.emptied, report.lost, report.cut) == collated(c) == (58, 352, 62)
    assert report.line(16) == ("data: data.max_seq_len=16 cuts 62 of 64 training records; 352 "
                               "of 376 supervised tokens lost (93.6%); 58 records keep no "
                               "supervised token")


@pytest.mark.parametrize(("block", "emptied"), [(4, 58), (8, 64)])
def test_block_diffusion_error_policy_names_the_emptied_records(block, emptied):
    with pytest.raises(ConfigError, match=(
            rf"^data.max_seq_len=16 cuts the whole response of {emptied} of 64 training records "
            rf"\(e.g. task:reverse/train\[\d+\], .*\); a response keeps only its whole blocks of "
            rf"{block} tokens that fit under the cap of 16: they would train on nothing. Raise "
            rf"data.max_seq_len \(the longest record has 19 tokens; data.max_seq_len=\d+ keeps "
            rf"every record whole\), or set data.truncation=drop")):
        block_diffusion_components(16, f"strategy.block_size={block}")


def test_block_diffusion_drop_policy_leaves_out_every_record_the_collator_cuts():
    c = block_diffusion_components(20, "data.truncation=drop")
    report = c.cap_reports[0]
    assert report.dropped == report.cut == 58 and len(c.train_set) == 6
    assert collated(c) == (0, 0, 0)  # what is left is trained whole
    assert report.lost == 376 - c.train_set.num_supervised_tokens == 348
    # At 16 every validation record is cut (training keeps 2): nothing would be validated.
    with pytest.raises(ConfigError, match=r"data.max_seq_len=16 with data.truncation=drop leaves "
                                          r"no validation record: it cuts every one; .* \(the "
                                          r"least that keeps one whole is data.max_seq_len=20\)"):
        block_diffusion_components(16, "data.truncation=drop")
