"""The user-like task suite: chat-format JSONL splits and a small BPE tokenizer, written
deterministically (same files, byte for byte, on every machine).

    python tests/suite/generate.py [OUT_DIR]      # default: tests/suite/data (git-ignored)

writes ``OUT_DIR/<task>/{train,validation,test}.jsonl`` (one ``{"messages": [...]}`` per line)
and ``OUT_DIR/bpe/`` (a Hugging Face tokenizer directory trained on the suite's train text).

This is not a bundled demo task: it is how we check that training generalises beyond the
task the defaults were tuned on. Every answer is fully determined by the conversation, test
problems never occur in train, and the mappings differ in kind:

=========  ======  ====================================================  ============
task       turns   mapping                                               answer bytes
=========  ======  ====================================================  ============
lookup     1       letters -> words of a fixed table (``"code bdk"`` ->   3-34
                   ``"bee dog kiwi"``): a per-token lookup
transform  1       string transforms of a random word (reverse, upper,   3-20
                   double each letter, rotate left)
arith      1       ``a+b`` / ``a-b`` / ``a*b`` on small numbers           1-3
chat       1-3     turn 1 a lookup; later turns ``reverse`` / ``upper`` / 1-24
                   ``first`` / ``count`` act on the previous answer
=========  ======  ====================================================  ============

Exact match is scored on the *last* assistant turn, given every earlier turn as written
(answers count bytes; the chat template adds one end-of-turn token). With the byte tokenizer
the longest conversation is 107 tokens, under the default ``data.max_seq_len``.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

SPLIT_SIZES = {"train": 4000, "validation": 200, "test": 200}
_BUCKETS = {"train": range(0, 80), "validation": range(80, 90), "test": range(90, 100)}
LETTERS = "abcdefghijklmnop"
# The lookup table (letter -> word): words of 3-4 bytes, so a 7-letter code gives <= 34 bytes.
WORDS = dict(zip(LETTERS, ["ant", "bee", "cat", "dog", "emu", "fox", "gnu", "hen", "ibis",
                           "jay", "kiwi", "lynx", "mole", "newt", "owl", "pig"]))
TASKS = ("lookup", "transform", "arith", "chat")
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|end|>", "<|mask|>", "<|system|>", "<|user|>",
                  "<|assistant|>"]
# bos, then per message <|role|>content<|end|>; <|end|> is EOS (ends a turn and generation).
CHAT_TEMPLATE = ("<|bos|>{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
BPE_VOCAB = 384


def _bucket(task: str, key: str) -> int:
    digest = hashlib.blake2b(f"suite\x00{task}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % 100


def _code(rng: random.Random, lo: int, hi: int) -> str:
    return "".join(rng.choice(LETTERS) for _ in range(rng.randint(lo, hi)))


def _lookup(code: str) -> str:
    return " ".join(WORDS[c] for c in code)


def lookup(rng: random.Random) -> tuple[str, list[dict]]:
    code = _code(rng, 1, 7)
    return code, [{"role": "user", "content": f"code {code}"},
                  {"role": "assistant", "content": _lookup(code)}]


TRANSFORMS = {
    "reverse": lambda w: w[::-1],
    "upper": str.upper,
    "double": lambda w: "".join(c + c for c in w),
    "rotate": lambda w: w[1:] + w[:1],
}


def transform(rng: random.Random) -> tuple[str, list[dict]]:
    op = rng.choice(sorted(TRANSFORMS))
    word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 10)))
    return f"{op} {word}", [{"role": "user", "content": f"{op} {word}"},
                            {"role": "assistant", "content": TRANSFORMS[op](word)}]


def arith(rng: random.Random) -> tuple[str, list[dict]]:
    op = rng.choice("+-*")
    a, b = (rng.randint(0, 99), rng.randint(0, 99)) if op != "*" else \
        (rng.randint(0, 12), rng.randint(0, 12))
    if op == "-" and b > a:
        a, b = b, a
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"{a}{op}{b}", [{"role": "user", "content": f"{a}{op}{b}="},
                           {"role": "assistant", "content": str(value)}]


FOLLOW_UPS = {
    "reverse": lambda words: " ".join(reversed(words)),
    "upper": lambda words: " ".join(words).upper(),
    "first": lambda words: words[0],
    "count": lambda words: str(len(words)),
}


def chat(rng: random.Random) -> tuple[str, list[dict]]:
    """Half the conversations have one turn, the rest two or three (a quarter each)."""
    code = _code(rng, 1, 5)  # three turns stay under the default max_seq_len with bytes
    turns = rng.choice([1, 1, 2, 3])
    messages = [{"role": "user", "content": f"code {code}"},
                {"role": "assistant", "content": _lookup(code)}]
    key = [code]
    for _ in range(turns - 1):
        op = rng.choice(sorted(FOLLOW_UPS))
        previous = messages[-1]["content"].lower().split(" ")
        messages += [{"role": "user", "content": op},
                     {"role": "assistant", "content": FOLLOW_UPS[op](previous)}]
        key.append(op)
    return "/".join(key), messages


GENERATORS = {"lookup": lookup, "transform": transform, "arith": arith, "chat": chat}


def split_records(task: str, split: str, n: int | None = None) -> list[dict]:
    """``n`` distinct records of ``split`` (a problem's split is a hash of its key, so test
    problems never occur in train); deterministic in ``(task, split, n)``."""
    n = SPLIT_SIZES[split] if n is None else n
    rng = random.Random(f"suite/{task}/{split}")
    seen: set[str] = set()
    out: list[dict] = []
    for _ in range(200 * n):
        key, messages = GENERATORS[task](rng)
        if key in seen or _bucket(task, key) not in _BUCKETS[split]:
            continue
        seen.add(key)
        out.append({"messages": messages})
        if len(out) == n:
            return out
    raise RuntimeError(f"task {task!r} has fewer than {n} distinct {split} problems")


def write_splits(out: Path) -> None:
    for task in TASKS:
        (out / task).mkdir(parents=True, exist_ok=True)
        for split in SPLIT_SIZES:
            lines = [json.dumps(r, sort_keys=True) for r in split_records(task, split)]
            (out / task / f"{split}.jsonl").write_text("\n".join(lines) + "\n")


def build_bpe(out: Path, texts: list[str]) -> Path:
    """A byte-level BPE (vocab ``BPE_VOCAB``) trained on ``texts``, saved as a local Hugging
    Face tokenizer directory with the suite's chat template; ``<|end|>`` is EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>",
                                   eos_token="<|end|>", pad_token="<|pad|>",
                                   mask_token="<|mask|>")
    fast.chat_template = CHAT_TEMPLATE
    path = out / "bpe"
    fast.save_pretrained(str(path))
    return path


def write_suite(out: Path) -> None:
    write_splits(out)
    texts = [m["content"] for task in TASKS for r in split_records(task, "train")
             for m in r["messages"]]
    build_bpe(out, texts)


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path(__file__).parent / "data"
    if out.exists():
        write_suite(out)  # deterministic: rewrites the same bytes
    else:
        # Written beside ``out`` and renamed into place in one step, so that two suite runs
        # started together never read each other's half-written files.
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
        write_suite(staging)
        try:
            staging.rename(out)
        except OSError:  # another writer finished first; its files are the same bytes
            shutil.rmtree(staging)
    print(f"suite written to {out}: tasks {', '.join(TASKS)}; tokenizer {out / 'bpe'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
