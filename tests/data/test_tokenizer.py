from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dlmkit.data import ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer
from tests.data.helpers import IGNORES_GENERATION_PROMPT, build_hf_tokenizer

# ---------------------------------------------------------------------------- byte tokenizer


def test_byte_special_ids_are_distinct_and_inside_the_vocabulary():
    t = ByteTokenizer()
    ids = [t.pad_token_id, t.bos_token_id, t.eos_token_id, t.mask_token_id]
    assert len(set(ids)) == 4
    assert all(256 <= i < t.vocab_size for i in ids)
    assert t.vocab_size == 264
    assert t.special_token_ids == frozenset(range(256, 264))
    assert set(t.stop_token_ids) == {t.eos_token_id, t.token_to_id("<|end|>")}
    assert isinstance(t, Tokenizer)


@given(st.text(max_size=40))
def test_byte_encode_decode_round_trip(text):
    t = ByteTokenizer()
    ids = t.encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert t.decode(ids) == text
    assert t.encode(text, add_special_tokens=True) == [t.bos_token_id, *ids]


def test_byte_decode_specials_and_errors():
    t = ByteTokenizer()
    ids = [t.bos_token_id, *t.encode("hé"), t.eos_token_id, t.pad_token_id]
    assert t.decode(ids) == "<|bos|>hé<|eos|><|pad|>"
    assert t.decode(ids, skip_special_tokens=True) == "hé"
    with pytest.raises(ValueError, match="264"):
        t.decode([264])
    with pytest.raises(TypeError, match="text"):
        t.encode(b"bytes")


def test_byte_save_load_round_trip(tmp_path):
    t = ByteTokenizer()
    t.save_pretrained(tmp_path / "tok")
    loaded = ByteTokenizer.load(tmp_path / "tok")
    assert loaded.vocab_size == t.vocab_size
    assert loaded.mask_token_id == t.mask_token_id
    assert isinstance(load_tokenizer(tmp_path / "tok"), ByteTokenizer)
    spec = json.loads((tmp_path / "tok" / "dlmkit_tokenizer.json").read_text())
    spec["special_tokens"]["<|mask|>"] = 999
    (tmp_path / "tok" / "dlmkit_tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="does not match"):
        ByteTokenizer.load(tmp_path / "tok")
    with pytest.raises(FileNotFoundError, match="missing"):
        ByteTokenizer.load(tmp_path)


def test_load_tokenizer_specs(tmp_path):
    assert isinstance(load_tokenizer("byte"), ByteTokenizer)
    t = ByteTokenizer()
    assert load_tokenizer(t) is t
    with pytest.raises(ValueError, match="'byte' or an existing local directory"):
        load_tokenizer(str(tmp_path / "nope"))
    with pytest.raises(TypeError, match="tokenizer spec"):
        load_tokenizer(3)


def _byte_reference(messages):
    """What the byte template must produce, built independently of the implementation."""
    t = ByteTokenizer()
    ids, mask = [t.bos_token_id], [0]
    for m in messages:
        header = [t.token_to_id(f"<|{m['role']}|>")]
        body = list(m["content"].encode()) + [t.token_to_id("<|end|>")]
        ids += header + body
        mask += [0] * len(header) + [int(m["role"] == "assistant")] * len(body)
    return ids, mask


def test_byte_chat_single_turn_mask_is_exact():
    t = ByteTokenizer()
    msgs = [{"role": "user", "content": "12+345="}, {"role": "assistant", "content": "357"}]
    enc = t.apply_chat_template(msgs)
    assert (enc.input_ids, enc.loss_mask) == _byte_reference(msgs)
    supervised = [i for i, m in zip(enc.input_ids, enc.loss_mask) if m]
    assert t.decode(supervised) == "357<|end|>"
    prompt = t.apply_chat_template(msgs[:1], add_generation_prompt=True)
    assert enc.input_ids[: len(prompt.input_ids)] == prompt.input_ids
    assert enc.loss_mask.index(1) == len(prompt.input_ids)  # right after the assistant header
    assert prompt.loss_mask == [0] * len(prompt.input_ids)


roles = st.sampled_from(["system", "user", "assistant"])
conversations = st.lists(
    st.fixed_dictionaries({"role": roles, "content": st.text(max_size=6)}), min_size=1, max_size=6
)


@given(conversations)
@settings(max_examples=60, deadline=None)
def test_byte_chat_multi_turn_mask_matches_reference(msgs):
    enc = ByteTokenizer().apply_chat_template(msgs)
    assert (enc.input_ids, enc.loss_mask) == _byte_reference(msgs)
    n_assistant = sum(m["role"] == "assistant" for m in msgs)
    assert len(enc.assistant_spans) == n_assistant
    for (s, e), m in zip(enc.assistant_spans, [m for m in msgs if m["role"] == "assistant"]):
        assert ByteTokenizer().decode(enc.input_ids[s:e]) == m["content"] + "<|end|>"


def test_byte_chat_rejects_unknown_role_and_bad_messages():
    t = ByteTokenizer()
    with pytest.raises(ValueError, match="role.*'tool'"):
        t.apply_chat_template([{"role": "tool", "content": "x"}])
    with pytest.raises(TypeError, match="messages"):
        t.apply_chat_template("hello")
    with pytest.raises(ValueError, match="content"):
        t.apply_chat_template([{"role": "user", "content": 3}])


# ------------------------------------------------------------------------------ HF adapter


def test_hf_adds_mask_token_and_reports_it(hf_tokenizer_dir):
    t = load_tokenizer(hf_tokenizer_dir)
    assert isinstance(t, HFTokenizer)
    assert t.num_added_tokens == 1
    assert t.mask_token_id == t.vocab_size - 1
    assert t.hf.mask_token == "<|mask|>"
    assert t.pad_token_id == t.hf.convert_tokens_to_ids("<pad>")
    assert t.eos_token_id == t.hf.convert_tokens_to_ids("</s>")
    assert t.decode(t.encode("hello world")) == "hello world"


def test_hf_save_keeps_the_mask_token(hf_tokenizer_dir, tmp_path):
    t = load_tokenizer(hf_tokenizer_dir)
    t.save_pretrained(tmp_path / "out")
    again = load_tokenizer(tmp_path / "out")
    assert again.num_added_tokens == 0
    assert (again.mask_token_id, again.vocab_size) == (t.mask_token_id, t.vocab_size)


def test_hf_existing_mask_token_is_used():
    hf = build_hf_tokenizer(pad=True)
    hf.add_special_tokens({"mask_token": "[MASK]"})
    t = HFTokenizer(hf)
    assert t.num_added_tokens == 0
    assert t.mask_token_id == hf.convert_tokens_to_ids("[MASK]")


def test_hf_without_pad_token_is_an_error_unless_eos_allowed():
    with pytest.raises(ValueError, match="no pad token.*allow_eos_as_pad"):
        HFTokenizer(build_hf_tokenizer(pad=False))
    t = HFTokenizer(build_hf_tokenizer(pad=False), allow_eos_as_pad=True)
    assert t.pad_token_id == t.eos_token_id


def _supervised_text(t, enc):
    return [t.decode(enc.input_ids[s:e]) for s, e in enc.assistant_spans], [
        i for i, m in zip(enc.input_ids, enc.loss_mask) if m
    ]


def test_hf_chat_mask_without_generation_tags_single_turn(hf_tokenizer_dir):
    t = load_tokenizer(hf_tokenizer_dir)
    msgs = [{"role": "user", "content": "2+2=?"}, {"role": "assistant", "content": "hello fox"}]
    enc = t.apply_chat_template(msgs)
    texts, _ = _supervised_text(t, enc)
    assert texts == ["hello fox<|im_end|>\n"]
    prompt = t.apply_chat_template(msgs[:1], add_generation_prompt=True).input_ids
    # The prompt part has exactly the ids a generation prompt gets, and supervision starts
    # right after the assistant header.
    assert enc.input_ids[: len(prompt)] == prompt
    assert enc.loss_mask == [0] * len(prompt) + [1] * (len(enc.input_ids) - len(prompt))
    assert t.decode(prompt).endswith("<|im_start|>assistant\n")
    assert enc.input_ids[0] == t.bos_token_id


def test_hf_chat_mask_multi_turn_is_exact(hf_tokenizer_dir):
    t = load_tokenizer(hf_tokenizer_dir)
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "world"},
        {"role": "user", "content": "the fox?"},
        {"role": "assistant", "content": "jumps over the lazy dog"},
    ]
    enc = t.apply_chat_template(msgs)
    texts, _ = _supervised_text(t, enc)
    assert texts == ["world<|im_end|>\n", "jumps over the lazy dog<|im_end|>\n"]
    # Unsupervised tokens are exactly the headers and the non-assistant turns.
    unsupervised = t.decode([i for i, m in zip(enc.input_ids, enc.loss_mask) if not m])
    assert unsupervised == (
        "<s><|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n"
        "<|im_start|>assistant\n<|im_start|>user\nthe fox?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert t.decode(enc.input_ids) == t.hf.apply_chat_template(msgs, tokenize=False)


def test_hf_template_that_ignores_the_generation_prompt():
    t = HFTokenizer(build_hf_tokenizer(pad=True, chat_template=IGNORES_GENERATION_PROMPT))
    msgs = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": " world "},
        {"role": "user", "content": "fox"},
        {"role": "assistant", "content": "dog"},
    ]
    enc = t.apply_chat_template(msgs)
    texts, _ = _supervised_text(t, enc)
    assert texts == ["world</s>", "dog</s>"]


def test_hf_template_that_is_not_prefix_stable_is_an_error():
    unstable = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}"
        "{% if loop.last %} (last){% endif %}\n{% endfor %}"
    )
    t = HFTokenizer(build_hf_tokenizer(pad=True, chat_template=unstable))
    msgs = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    with pytest.raises(ValueError, match="prefix-stable"):
        t.apply_chat_template(msgs)


def test_hf_without_chat_template_is_an_error():
    hf = build_hf_tokenizer(pad=True)
    hf.chat_template = None
    t = HFTokenizer(hf)
    with pytest.raises(ValueError, match="no chat template"):
        t.apply_chat_template([{"role": "user", "content": "a"}])
    t2 = HFTokenizer(build_hf_tokenizer(pad=True), chat_template=IGNORES_GENERATION_PROMPT)
    assert "[USER]" in t2.decode(
        t2.apply_chat_template([{"role": "user", "content": "a"}]).input_ids
    )


def test_directory_without_tokenizer_files_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="holds no tokenizer"):
        load_tokenizer(tmp_path)


# ------------------------------------------------------- the files plain transformers loads


@pytest.fixture(scope="module")
def byte_as_hf(tmp_path_factory):
    """The byte tokenizer as `AutoTokenizer.from_pretrained` loads it from a saved directory.
    Before: save_pretrained wrote dlmkit_tokenizer.json only, which transformers cannot load."""
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("byte_hf")
    ByteTokenizer().save_pretrained(path)
    assert isinstance(load_tokenizer(path), ByteTokenizer)  # dlmkit still loads its own
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


TEXTS = ["hello world", "héllo wörld — 日本語 🎉 ∑x²", "  two  spaces\n\ttab\r\n", "",
         "a\x00b\x7f\x80", "rev abc", "Ünïcödé at the end: €"]


@pytest.mark.parametrize("text", TEXTS)
def test_byte_tokenizer_in_transformers_encodes_like_dlmkit(byte_as_hf, text):
    t = ByteTokenizer()
    assert byte_as_hf.encode(text, add_special_tokens=False) == t.encode(text)
    assert byte_as_hf.encode(text) == t.encode(text, add_special_tokens=True)  # BOS first
    assert byte_as_hf.decode(t.encode(text)) == text


@settings(max_examples=150)
@given(st.lists(st.integers(0, 263), max_size=16), st.booleans())
@example([0xD7, 261, 0x9B], True)  # a skipped special inside a UTF-8 sequence: joined
def test_byte_tokenizer_in_transformers_decodes_like_dlmkit(byte_as_hf, ids, skip):
    # Any ids, invalid UTF-8 and special tokens included.
    t = ByteTokenizer()
    assert byte_as_hf.decode(ids, skip_special_tokens=skip) == t.decode(ids, skip)


@settings(max_examples=60)
@given(st.text(max_size=40).filter(lambda s: "<|" not in s))
def test_byte_tokenizer_in_transformers_encodes_any_text_like_dlmkit(byte_as_hf, text):
    assert byte_as_hf.encode(text, add_special_tokens=False) == ByteTokenizer().encode(text)


def test_byte_tokenizer_in_transformers_has_the_special_ids_and_chat_template(byte_as_hf):
    t = ByteTokenizer()
    hf = byte_as_hf
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id, hf.mask_token_id) == (
        t.bos_token_id, t.eos_token_id, t.pad_token_id, t.mask_token_id)
    assert len(hf) == t.vocab_size
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "rév abc"},
            {"role": "assistant", "content": "cba"}, {"role": "user", "content": "again"}]
    for prompt in (True, False):
        got = hf.apply_chat_template(msgs, add_generation_prompt=prompt, return_dict=True)
        assert got["input_ids"] == t.apply_chat_template(msgs, prompt).input_ids
    from jinja2.exceptions import TemplateError

    with pytest.raises(TemplateError, match="roles system/user/assistant only, got tool"):
        hf.apply_chat_template([{"role": "tool", "content": "x"}])


def test_hf_end_of_turn_is_read_from_the_chat_template():
    """Before: HFTokenizer stopped at EOS only, which a ChatML template never emits after an
    assistant turn (it ends with <|im_end|>)."""
    chatml = HFTokenizer(build_hf_tokenizer(pad=True))
    im_end = chatml.hf.convert_tokens_to_ids("<|im_end|>")
    assert chatml.end_of_turn_token_id == im_end
    assert chatml.stop_token_ids == (chatml.eos_token_id, im_end)
    ends_with_eos = HFTokenizer(build_hf_tokenizer(pad=True,
                                                   chat_template=IGNORES_GENERATION_PROMPT))
    assert ends_with_eos.end_of_turn_token_id == ends_with_eos.eos_token_id
    assert ends_with_eos.stop_token_ids == (ends_with_eos.eos_token_id,)
    plain_text_turns = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    plain = HFTokenizer(build_hf_tokenizer(pad=True, chat_template=plain_text_turns))
    assert plain.end_of_turn_token_id is None and plain.stop_token_ids == (plain.eos_token_id,)
    assert ByteTokenizer().end_of_turn_token_id == ByteTokenizer().token_to_id("<|end|>")


def test_hf_save_writes_the_chat_template_into_tokenizer_config(hf_tokenizer_dir, tmp_path):
    from transformers import AutoTokenizer

    t = load_tokenizer(hf_tokenizer_dir)
    t.save_pretrained(tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    assert saved["chat_template"] == t.hf.chat_template
    hf = AutoTokenizer.from_pretrained(str(tmp_path / "out"), local_files_only=True)
    msgs = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "world"}]
    assert hf.apply_chat_template(msgs, return_dict=True)["input_ids"] == \
        t.apply_chat_template(msgs).input_ids
