"""A tiny Hugging Face tokenizer trained in-process (no download) and chat templates."""

from __future__ import annotations

CHATML_NO_GENERATION_TAGS = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# A template that ignores add_generation_prompt and trims content.
IGNORES_GENERATION_PROMPT = (
    "{% for m in messages %}[{{ m['role'] | upper }}]: {{ m['content'] | trim }}</s>{% endfor %}"
)


def build_hf_tokenizer(*, pad: bool = False, chat_template: str = CHATML_NO_GENERATION_TAGS):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"] + (["<pad>"] if pad else [])
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ["hello world, the quick brown fox jumps over the lazy dog 0123456789 + = ?"] * 20
    tok.train_from_iterator(corpus, trainer)
    kwargs = {"pad_token": "<pad>"} if pad else {}
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        chat_template=chat_template,
        **kwargs,
    )
