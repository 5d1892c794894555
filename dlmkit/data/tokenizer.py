"""Tokenizers behind one small interface: a built-in byte tokenizer and a Hugging Face adapter.

The rest of dlmkit only sees :class:`Tokenizer`: ids in, ids out, the special ids a diffusion
recipe needs (``pad``, ``eos``, ``bos``, ``mask``) and a chat template that also reports which
tokens belong to assistant turns (the supervised region of an SFT example).

Assistant spans are found the same way for every tokenizer, by rendering *prefixes* of the
conversation (see :meth:`Tokenizer.apply_chat_template`), so templates without
``{% generation %}`` tags are supported and multi-turn masks are exact.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ByteTokenizer",
    "ChatEncoding",
    "HFTokenizer",
    "Tokenizer",
    "load_tokenizer",
]

BYTE_TOKENIZER_FILE = "dlmkit_tokenizer.json"
_BYTE_FORMAT_VERSION = 1


def _byte_level_chars() -> list[str]:
    """The character the byte-level (GPT-2) pre-tokenizer writes for each byte: the byte's own
    character for printable Latin-1, ``chr(256 + k)`` for the k-th other byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


_BYTE_CHARS = _byte_level_chars()


@dataclass(frozen=True)
class ChatEncoding:
    """A rendered conversation.

    Attributes:
        input_ids: token ids, length ``L``, unshifted.
        loss_mask: ``L`` ints, 1 on every assistant turn's content and end-of-turn marker
            (everything from right after the assistant header to the end of that turn).
        assistant_spans: half-open ``(start, end)`` token ranges of those turns, in order.
    """

    input_ids: list[int]
    loss_mask: list[int]
    assistant_spans: list[tuple[int, int]]


def _check_messages(messages: Any) -> list[dict[str, str]]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError(
            f"messages must be a list of {{'role', 'content'}} dicts, got {type(messages).__name__}"
        )
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise TypeError(f"messages[{i}] must be a dict, got {type(m).__name__}: {m!r}")
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not role:
            raise ValueError(f"messages[{i}]['role'] must be a non-empty string, got {role!r}")
        if not isinstance(content, str):
            raise ValueError(
                f"messages[{i}]['content'] must be a string, got {type(content).__name__}"
            )
        out.append({"role": role, "content": content})
    return out


class Tokenizer:
    """The interface dlmkit uses; subclasses provide rendering and the special ids.

    Attributes every subclass sets:
        vocab_size: number of ids the model's embedding must cover (all ids < vocab_size).
        pad_token_id, eos_token_id, mask_token_id: ints. ``bos_token_id``: int or None.
        stop_token_ids: ids that end generation (EOS and, if the template has one,
            the end-of-turn marker).
        end_of_turn_token_id: the chat template's end-of-turn marker (None: it has none).
    """

    vocab_size: int
    pad_token_id: int
    eos_token_id: int
    bos_token_id: int | None
    mask_token_id: int
    stop_token_ids: tuple[int, ...]
    end_of_turn_token_id: int | None = None

    # -- to implement ------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Text -> ids. ``add_special_tokens`` adds what the tokenizer normally adds (e.g. BOS)."""
        raise NotImplementedError

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        raise NotImplementedError

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        raise NotImplementedError

    def pieces(self) -> dict[int, str]:
        """The ordinary vocabulary by id, in the tokenizer's own spelling, where a piece that is
        two others written one after the other means exactly those two (special and added
        tokens left out). Used to split training tokens (:mod:`dlmkit.data.split_tokens`)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not list its pieces, so data.split_tokens cannot "
            "split its tokens"
        )

    def _render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool):
        """Render a conversation to a ``str`` or a ``list[int]`` (whatever
        :meth:`_tokenize_piece` accepts); rendering must be prefix-stable."""
        raise NotImplementedError

    def _tokenize_piece(self, piece) -> list[int]:
        raise NotImplementedError

    # -- shared ------------------------------------------------------------------------------
    @property
    def special_token_ids(self) -> frozenset[int]:
        ids = {self.pad_token_id, self.eos_token_id, self.mask_token_id}
        if self.bos_token_id is not None:
            ids.add(self.bos_token_id)
        return frozenset(ids)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False
    ) -> ChatEncoding:
        """Render ``messages`` and mark every assistant turn as supervised.

        For assistant message ``i`` the supervised region starts where
        ``render(messages[:i], add_generation_prompt=True)`` ends (right after the assistant
        header) and ends where ``render(messages[:i+1])`` ends (content + end-of-turn marker).
        If the template ignores ``add_generation_prompt``, the start is where the message's
        content first appears after ``render(messages[:i])``.

        The rendering is cut at these boundaries and each piece tokenized on its own, so the
        prompt part of a single-turn example has exactly the ids a generation prompt gets.

        Raises:
            ValueError: the template is not prefix-stable (an earlier rendering is not a prefix
                of a later one), so spans cannot be located exactly.
        """
        msgs = _check_messages(messages)
        full = self._render_chat(msgs, add_generation_prompt)
        cuts: list[tuple[int, int]] = []  # supervised ranges, in rendering units
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            before = self._render_prefix(msgs[:i], False)
            with_header = self._render_prefix(msgs[:i], True)
            through = self._render_chat(msgs[: i + 1], False)
            if before is None:
                before = full[:0]
            for name, part in (("messages[:i]", before), ("messages[:i+1]", through)):
                if full[: len(part)] != part:
                    raise ValueError(
                        f"chat template is not prefix-stable: rendering {name} (i={i}) is not a "
                        "prefix of the whole conversation, so assistant spans cannot be found"
                    )
            if (
                with_header is not None
                and len(with_header) > len(before)
                and through[: len(with_header)] == with_header
            ):
                start = len(with_header)
            else:  # the template ignores add_generation_prompt: find where the content begins
                start = _find(through, self._content_unit(m["content"]), len(before))
                if start is None:
                    raise ValueError(
                        f"cannot locate the content of assistant messages[{i}] in the rendered "
                        "template; the template must emit the content verbatim"
                    )
            cuts.append((start, len(through)))
        ids: list[int] = []
        mask: list[int] = []
        spans: list[tuple[int, int]] = []
        pos = 0
        for start, end in cuts:
            for piece, supervised in ((full[pos:start], 0), (full[start:end], 1)):
                piece_ids = self._tokenize_piece(piece) if len(piece) else []
                if supervised:
                    spans.append((len(ids), len(ids) + len(piece_ids)))
                ids.extend(piece_ids)
                mask.extend([supervised] * len(piece_ids))
            pos = end
        tail = self._tokenize_piece(full[pos:]) if len(full) > pos else []
        ids.extend(tail)
        mask.extend([0] * len(tail))
        return ChatEncoding(ids, mask, spans)

    def _render_prefix(self, messages: list[dict[str, str]], add_generation_prompt: bool):
        """Render a leading part of a conversation; None when it is empty and the template
        cannot render an empty conversation."""
        if messages:
            return self._render_chat(messages, add_generation_prompt)
        try:
            return self._render_chat(messages, add_generation_prompt)
        except Exception:  # many templates index messages[0]
            return None

    def _content_unit(self, content: str):
        """Content in rendering units, for the search fallback (stripped: templates often trim)."""
        return content.strip()


def _find(haystack, needle, start: int) -> int | None:
    """First index >= start where ``needle`` occurs in ``haystack`` (str or list)."""
    if isinstance(haystack, str):
        at = haystack.find(needle, start)
        return None if at < 0 else at
    n = len(needle)
    for at in range(start, len(haystack) - n + 1):
        if haystack[at : at + n] == needle:
            return at
    return None


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids ``0..255``, then the special tokens.

    ========  =====================================================
    id        token
    ========  =====================================================
    0..255    the byte with that value
    256       ``<|pad|>``
    257       ``<|bos|>``
    258       ``<|eos|>``
    259       ``<|mask|>``
    260       ``<|system|>``
    261       ``<|user|>``
    262       ``<|assistant|>``
    263       ``<|end|>`` (end of a turn)
    ========  =====================================================

    ``vocab_size`` is 264. Chat format: ``<|bos|>`` then, per message,
    ``<|role|> content-bytes <|end|>``; the generation prompt is ``<|assistant|>``.
    Special tokens are ids, never parsed from text, so user text cannot inject them.

    :meth:`save_pretrained` also writes the same tokenizer for plain ``transformers``
    (``AutoTokenizer.from_pretrained``): the same ids for any text, the same decoding, and a
    chat template whose ``apply_chat_template`` gives the ids training used. One difference
    is Hugging Face's: its tokenizers parse special-token names written in text (the chat
    template depends on that), so a text containing ``<|end|>`` becomes that token there.
    """

    SPECIAL_TOKENS = (
        "<|pad|>",
        "<|bos|>",
        "<|eos|>",
        "<|mask|>",
        "<|system|>",
        "<|user|>",
        "<|assistant|>",
        "<|end|>",
    )
    ROLES = ("system", "user", "assistant")

    def __init__(self) -> None:
        self._special = {tok: 256 + i for i, tok in enumerate(self.SPECIAL_TOKENS)}
        self.vocab_size = 256 + len(self.SPECIAL_TOKENS)
        self.pad_token_id = self._special["<|pad|>"]
        self.bos_token_id = self._special["<|bos|>"]
        self.eos_token_id = self._special["<|eos|>"]
        self.mask_token_id = self._special["<|mask|>"]
        self.end_of_turn_token_id = self._special["<|end|>"]
        self.stop_token_ids = (self.eos_token_id, self.end_of_turn_token_id)
        self._role_ids = {r: self._special[f"<|{r}|>"] for r in self.ROLES}

    @property
    def special_token_ids(self) -> frozenset[int]:
        return frozenset(self._special.values())

    def pieces(self) -> dict[int, str]:
        """One byte per piece (as the character with that code): nothing splits."""
        return {b: chr(b) for b in range(256)}

    def token_to_id(self, token: str) -> int:
        """Id of a special token such as ``"<|user|>"``."""
        if token not in self._special:
            raise ValueError(f"token must be one of {list(self._special)}, got {token!r}")
        return self._special[token]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """UTF-8 bytes of ``text``; ``add_special_tokens`` prepends ``<|bos|>``."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id, *ids] if add_special_tokens else ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Bytes -> text (invalid UTF-8 becomes U+FFFD); specials are written as their names
        unless ``skip_special_tokens`` (then the text is that of the other bytes, joined, as
        Hugging Face tokenizers decode it)."""
        names = {v: k for k, v in self._special.items()}
        out: list[str] = []
        buf = bytearray()
        for raw in ids:
            i = int(raw)
            if 0 <= i < 256:
                buf.append(i)
                continue
            if i not in names:
                raise ValueError(f"ids contains {i}, outside the vocabulary [0, {self.vocab_size})")
            if not skip_special_tokens:
                out.append(buf.decode("utf-8", errors="replace"))
                buf.clear()
                out.append(names[i])
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def _render_chat(self, messages, add_generation_prompt):
        ids = [self.bos_token_id]
        for i, m in enumerate(messages):
            if m["role"] not in self._role_ids:
                raise ValueError(
                    f"messages[{i}]['role'] must be one of {list(self.ROLES)} for the byte "
                    f"tokenizer, got {m['role']!r}"
                )
            ids.append(self._role_ids[m["role"]])
            ids.extend(m["content"].encode("utf-8"))
            ids.append(self.end_of_turn_token_id)
        if add_generation_prompt:
            ids.append(self._role_ids["assistant"])
        return ids

    def _tokenize_piece(self, piece) -> list[int]:
        return list(piece)

    def _content_unit(self, content: str):
        return list(content.encode("utf-8"))

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write ``directory/dlmkit_tokenizer.json`` (what dlmkit loads) and the same tokenizer
        for ``transformers.AutoTokenizer``: ``tokenizer.json`` and ``tokenizer_config.json``
        (with the chat template). The directory is created if missing."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        spec = {
            "type": "byte",
            "version": _BYTE_FORMAT_VERSION,
            "vocab_size": self.vocab_size,
            "special_tokens": self._special,
        }
        (path / BYTE_TOKENIZER_FILE).write_text(json.dumps(spec, indent=2) + "\n")
        self._hf_tokenizer().save(str(path / "tokenizer.json"))
        (path / "tokenizer_config.json").write_text(json.dumps(self._hf_config(), indent=2) + "\n")

    def _hf_tokenizer(self):
        """A ``tokenizers`` tokenizer with this one's ids: byte-level pieces with no merges (one
        token per UTF-8 byte, byte ``b`` at id ``b``), the special tokens at their ids, and
        ``<|bos|>`` prepended when special tokens are added, as :meth:`encode` does."""
        from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
        from tokenizers import Tokenizer as RustTokenizer

        # The byte-level pre-tokenizer writes byte b as the character _BYTE_CHARS[b].
        vocab = {_BYTE_CHARS[b]: b for b in range(256)}
        tok = RustTokenizer(models.BPE(vocab=vocab, merges=[]))
        # No regex split: without merges it would change nothing, and each byte stays a token.
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        specials = sorted(self._special, key=self._special.get)
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
        bos = "<|bos|>"
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, self.bos_token_id)])
        got = {t: tok.token_to_id(t) for t in specials}
        if got != self._special:  # the added tokens must land right after the 256 bytes
            raise RuntimeError(f"internal error: HF special token ids {got} != {self._special}")
        return tok

    def _hf_config(self) -> dict:
        """``tokenizer_config.json``: the special tokens by role and the chat template."""
        roles = ", ".join(repr(r) for r in self.ROLES)
        template = (
            "{{ bos_token }}{% for message in messages %}"
            f"{{% if message['role'] not in [{roles}] %}}"
            "{{ raise_exception('the byte tokenizer knows the roles " + "/".join(self.ROLES)
            + " only, got ' + message['role']) }}{% endif %}"
            "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
        )
        return {
            # The class name that transformers 4 and 5 both load (5 aliases it).
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<|bos|>",
            "eos_token": "<|eos|>",
            "pad_token": "<|pad|>",
            "mask_token": "<|mask|>",
            "additional_special_tokens": ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
            "clean_up_tokenization_spaces": False,
            "model_max_length": 1_000_000_000,
            "chat_template": template,
        }

    @classmethod
    def load(cls, directory: str | os.PathLike) -> ByteTokenizer:
        """Inverse of :meth:`save_pretrained`; checks the stored layout matches this version."""
        file = Path(directory) / BYTE_TOKENIZER_FILE
        try:
            spec = json.loads(file.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"no byte tokenizer in {directory}: {file} is missing") from (
                None
            )
        except json.JSONDecodeError as e:
            raise ValueError(f"{file}: not valid JSON ({e})") from None
        tok = cls()
        if spec.get("type") != "byte" or spec.get("special_tokens") != tok._special:
            raise ValueError(
                f"{file}: layout {spec.get('type')!r} / {spec.get('special_tokens')!r} does not "
                f"match this dlmkit's byte tokenizer ({tok._special})"
            )
        return tok

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={self.vocab_size})"


class HFTokenizer(Tokenizer):
    """Adapter over a Hugging Face tokenizer.

    Args:
        tokenizer: a ``transformers`` tokenizer. It is modified in place: a mask token is added
            when it has none, and with ``allow_eos_as_pad`` its pad token is set to EOS.
        mask_token: the token added when the tokenizer has no mask token.
        allow_eos_as_pad: use EOS as the pad token when there is none (otherwise an error).
        chat_template: Jinja template overriding the tokenizer's own.

    Attributes:
        num_added_tokens: how many tokens this adapter added to the vocabulary. When > 0 the
            caller must resize the model's embeddings to at least ``vocab_size``.
        hf: the wrapped tokenizer.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        mask_token: str = "<|mask|>",
        allow_eos_as_pad: bool = False,
        chat_template: str | None = None,
        name: str | None = None,
    ) -> None:
        self.hf = tokenizer
        self.name = name or getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
        if chat_template is not None:
            tokenizer.chat_template = chat_template
        if tokenizer.eos_token_id is None:
            raise ValueError(
                f"tokenizer {self.name!r} has no EOS token; dlmkit needs one to end responses "
                "and to fill blocks (set eos_token in its tokenizer_config.json)"
            )
        if tokenizer.pad_token_id is None:
            if not allow_eos_as_pad:
                raise ValueError(
                    f"tokenizer {self.name!r} has no pad token; add one to the tokenizer or pass "
                    "allow_eos_as_pad=True (config: tokenizer.allow_eos_as_pad: true) to pad "
                    "with EOS"
                )
            tokenizer.pad_token = tokenizer.eos_token
        self.num_added_tokens = 0
        if tokenizer.mask_token_id is None:
            self.num_added_tokens = tokenizer.add_special_tokens({"mask_token": mask_token})
        self.vocab_size = len(tokenizer)
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.bos_token_id = None if tokenizer.bos_token_id is None else int(tokenizer.bos_token_id)
        self.mask_token_id = int(tokenizer.mask_token_id)

    @functools.cached_property
    def end_of_turn_token_id(self) -> int | None:
        """The special token the chat template ends an assistant turn with (``<|im_end|>``,
        ``<|eot_id|>``, ``<end_of_turn>``, or EOS itself), read from a rendered probe
        conversation: the last added token of its supervised span. None without a chat
        template, or when the template ends turns with plain text."""
        if not getattr(self.hf, "chat_template", None):
            return None
        probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
        try:
            encoded = self.apply_chat_template(probe)
        except Exception:  # any template error surfaces again when the data is rendered
            return None
        added = {int(i) for i in self.hf.added_tokens_decoder}
        start, end = encoded.assistant_spans[-1]
        marks = [i for i in encoded.input_ids[start:end] if i in added]
        return marks[-1] if marks else None

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """EOS and, when the chat template has one, its end-of-turn token (what an assistant
        turn ends with in training, so what a model trained on it emits)."""
        end = self.end_of_turn_token_id
        return (self.eos_token_id,) if end in (None, self.eos_token_id) else \
            (self.eos_token_id, end)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **kwargs: Any) -> HFTokenizer:
        """Load ``AutoTokenizer.from_pretrained(path)`` from a local directory (no download)."""
        from transformers import AutoTokenizer

        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"tokenizer directory {str(path)!r} does not exist")
        hf = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        return cls(hf, name=str(path), **kwargs)

    @property
    def special_token_ids(self) -> frozenset[int]:
        return frozenset(int(i) for i in self.hf.all_special_ids) | super().special_token_ids

    def pieces(self) -> dict[int, str]:
        """The vocabulary's own strings (byte-level BPE: one character per byte; SentencePiece:
        ``▁`` for a space), which concatenate as the text they stand for."""
        left_out = set(self.special_token_ids) | {int(i) for i in self.hf.added_tokens_decoder}
        return {int(i): s for s, i in self.hf.get_vocab().items() if int(i) not in left_out}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def _render_chat(self, messages, add_generation_prompt):
        if not getattr(self.hf, "chat_template", None):
            raise ValueError(
                f"tokenizer {self.name!r} has no chat template; pass chat_template= "
                "(config: tokenizer.chat_template) to render conversations"
            )
        return self.hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _tokenize_piece(self, piece) -> list[int]:
        return list(self.hf.encode(piece, add_special_tokens=False))

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write the wrapped tokenizer (with any added mask/pad token) as an HF directory; the
        chat template goes into ``tokenizer_config.json``, where every transformers version
        reads it (the default, ``chat_template.jinja``, is for recent ones only)."""
        self.hf.save_pretrained(str(directory), save_jinja_files=False)

    def __repr__(self) -> str:
        return (
            f"HFTokenizer({self.name!r}, vocab_size={self.vocab_size}, "
            f"mask_token_id={self.mask_token_id}, num_added_tokens={self.num_added_tokens})"
        )


# Files whose presence marks a directory as a Hugging Face tokenizer.
_HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json",
                       "tokenizer.model", "vocab.txt")


def load_tokenizer(
    spec: str | os.PathLike | Tokenizer,
    *,
    allow_eos_as_pad: bool = False,
    mask_token: str = "<|mask|>",
    chat_template: str | None = None,
) -> Tokenizer:
    """Build a tokenizer from ``"byte"``, a local directory, or pass a :class:`Tokenizer` through.

    A directory holding ``dlmkit_tokenizer.json`` loads the byte tokenizer; any other directory
    is loaded with ``transformers.AutoTokenizer`` and wrapped in :class:`HFTokenizer`.
    """
    if isinstance(spec, Tokenizer):
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(
            f"tokenizer spec must be 'byte', a directory path or a Tokenizer, got {spec!r}"
        )
    if str(spec) == "byte":
        return ByteTokenizer()
    path = Path(spec)
    if not path.is_dir():
        raise ValueError(
            f"tokenizer spec must be 'byte' or an existing local directory, got {str(spec)!r}"
        )
    if (path / BYTE_TOKENIZER_FILE).exists():
        return ByteTokenizer.load(path)
    if not any((path / name).exists() for name in _HF_TOKENIZER_FILES):
        raise ValueError(
            f"{path} holds no tokenizer: expected {BYTE_TOKENIZER_FILE} (dlmkit byte tokenizer) "
            f"or one of {', '.join(_HF_TOKENIZER_FILES)} (Hugging Face)"
        )
    return HFTokenizer.from_pretrained(
        path, allow_eos_as_pad=allow_eos_as_pad, mask_token=mask_token, chat_template=chat_template
    )
