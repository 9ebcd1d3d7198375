"""Tokenizers: a byte-level default and a wrapper around Hugging Face ``tokenizers``.

Both expose the same small interface, which is all the rest of Lab relies on:
``encode(text, add_bos=False, add_eos=False) -> list[int]``, ``decode(ids) -> str``
(special tokens skipped), ``batch_encode(texts, max_len) -> (ids [B, T] int32,
lengths [B] int32)``, ``vocab_size`` and the ids ``pad_id``, ``bos_id``,
``eos_id``, ``sep_id``.

The byte tokenizer is the embedded default: ids ``0..255`` are the UTF-8 bytes
of the text, then four special tokens ``PAD=256, BOS=257, EOS=258, SEP=259``.
``vocab_size`` is 264, the next multiple of 8 (ids 260..263 are reserved and
never produced), so that embedding and logit shapes tile well.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence

import numpy as np

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<sep>")


def _pad_batch(seqs: Sequence[Sequence[int]], max_len: int | None, pad_id: int,
               truncate: str) -> tuple[np.ndarray, np.ndarray]:
    if truncate not in ("left", "right", "error"):
        raise ValueError(f"truncate={truncate!r}; expected 'left', 'right' or 'error'")
    longest = max((len(s) for s in seqs), default=0)
    width = longest if max_len is None else int(max_len)
    if width <= 0 and seqs:
        raise ValueError(f"max_len={max_len!r}; expected a positive int")
    ids = np.full((len(seqs), width), pad_id, np.int32)
    lengths = np.zeros((len(seqs),), np.int32)
    for i, s in enumerate(seqs):
        s = list(s)
        if len(s) > width:
            if truncate == "error":
                raise ValueError(f"sequence {i} has {len(s)} tokens > max_len={width}")
            s = s[-width:] if truncate == "left" else s[:width]
        ids[i, : len(s)] = s
        lengths[i] = len(s)
    return ids, lengths


class ByteTokenizer:
    """UTF-8 bytes plus four special tokens (PAD, BOS, EOS, SEP); ``vocab_size`` 264.

    ``decode`` drops special and reserved ids and replaces invalid UTF-8 (a
    model may emit a partial multi-byte character) with U+FFFD.
    """

    name = "bytes"
    pad_id, bos_id, eos_id, sep_id = 256, 257, 258, 259
    num_special = 4
    vocab_size = 264

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Returns the token ids of ``text`` (optionally with BOS first / EOS last)."""
        if not isinstance(text, str):
            raise ValueError(f"encode expects a str, got {type(text).__name__}")
        ids = list(text.encode("utf-8"))
        if add_bos:
            ids.insert(0, self.bos_id)
        if add_eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Returns the text of ``ids``, special and reserved ids skipped."""
        data = bytes(int(i) for i in np.asarray(list(ids), dtype=np.int64).ravel() if 0 <= i < 256)
        return data.decode("utf-8", errors="replace")

    def token_to_id(self, token: str) -> int:
        """Id of a special token name (``"<eos>"``) or of a single byte character."""
        if token in SPECIAL_TOKENS:
            return 256 + SPECIAL_TOKENS.index(token)
        data = token.encode("utf-8")
        if len(data) != 1:
            raise ValueError(f"token {token!r} is neither a special token {SPECIAL_TOKENS} nor "
                             "a single byte")
        return data[0]

    def batch_encode(self, texts: Sequence[str], max_len: int | None = None, *,
                     add_bos: bool = False, add_eos: bool = False,
                     truncate: str = "right") -> tuple[np.ndarray, np.ndarray]:
        """Returns ``(ids [B, T] int32 right-padded with pad_id, lengths [B] int32)``.

        ``T`` is ``max_len`` or the longest sequence; longer sequences are cut
        on the ``truncate`` side (``"error"`` raises instead).
        """
        seqs = [self.encode(t, add_bos=add_bos, add_eos=add_eos) for t in texts]
        return _pad_batch(seqs, max_len, self.pad_id, truncate)

    def to_dict(self) -> dict:
        return {"type": "bytes", "vocab_size": self.vocab_size}

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=264)"


class HFTokenizer:
    """The byte tokenizer's interface over a Hugging Face ``tokenizers.Tokenizer``.

    Special ids are looked up by name among the usual spellings (Qwen's
    ``<|endoftext|>`` / ``<|im_end|>``, Llama's ``<s>`` / ``</s>``); a missing
    one is ``None`` and a missing PAD falls back to EOS (what ``transformers``
    does for these families). ``vocab_size`` counts added tokens.
    """

    name = "hf"
    _NAMES = {
        "bos": ("<|begin_of_text|>", "<s>", "<bos>", "<|endoftext|>"),
        "eos": ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "<|im_end|>"),
        "pad": ("<|pad|>", "<pad>", "<|finetune_right_pad_id|>"),
        "sep": ("<sep>", "<|im_sep|>"),
    }

    def __init__(self, tokenizer, *, bos: str | None = None, eos: str | None = None,
                 pad: str | None = None):
        from tokenizers import Tokenizer  # local: only real checkpoints need it

        if not isinstance(tokenizer, Tokenizer):
            raise ValueError(f"HFTokenizer wraps a tokenizers.Tokenizer, got "
                             f"{type(tokenizer).__name__}")
        self.tokenizer = tokenizer
        given = {"bos": bos, "eos": eos, "pad": pad}
        ids = {}
        for role, names in self._NAMES.items():
            if given.get(role) is not None:
                tid = tokenizer.token_to_id(given[role])
                if tid is None:
                    raise ValueError(f"{role}={given[role]!r} is not in the tokenizer vocabulary")
                ids[role] = tid
                continue
            ids[role] = next((tokenizer.token_to_id(n) for n in names
                              if tokenizer.token_to_id(n) is not None), None)
        self.bos_id, self.eos_id, self.sep_id = ids["bos"], ids["eos"], ids["sep"]
        self.pad_id = ids["pad"] if ids["pad"] is not None else self.eos_id
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_file(cls, path: str, **kwargs) -> HFTokenizer:
        """Loads ``tokenizer.json`` (a file, or a directory that holds one)."""
        from tokenizers import Tokenizer

        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.exists(path):
            raise ValueError(f"tokenizer file {path!r} does not exist")
        try:
            tok = Tokenizer.from_file(path)
        except Exception as e:  # tokenizers raises a bare Exception on bad JSON
            raise ValueError(f"{path!r} is not a valid tokenizers JSON file: {e}") from e
        return cls(tok, **kwargs)

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Token ids of ``text`` without the tokenizer's own post-processing specials."""
        if not isinstance(text, str):
            raise ValueError(f"encode expects a str, got {type(text).__name__}")
        ids = list(self.tokenizer.encode(text, add_special_tokens=False).ids)
        if add_bos:
            if self.bos_id is None:
                raise ValueError("add_bos=True but this tokenizer has no BOS token")
            ids.insert(0, self.bos_id)
        if add_eos:
            if self.eos_id is None:
                raise ValueError("add_eos=True but this tokenizer has no EOS token")
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def token_to_id(self, token: str) -> int:
        tid = self.tokenizer.token_to_id(token)
        if tid is None:
            raise ValueError(f"token {token!r} is not in the vocabulary")
        return tid

    def batch_encode(self, texts: Sequence[str], max_len: int | None = None, *,
                     add_bos: bool = False, add_eos: bool = False,
                     truncate: str = "right") -> tuple[np.ndarray, np.ndarray]:
        """Same contract as :meth:`ByteTokenizer.batch_encode`."""
        seqs = [self.encode(t, add_bos=add_bos, add_eos=add_eos) for t in texts]
        return _pad_batch(seqs, max_len, self.pad_id, truncate)

    def to_dict(self) -> dict:
        return {"type": "hf", "vocab_size": self.vocab_size,
                "tokenizer": json.loads(self.tokenizer.to_str())}

    def __repr__(self) -> str:
        return f"HFTokenizer(vocab_size={self.vocab_size})"


def tokenizer_from_dict(d: dict):
    """Inverse of ``to_dict`` for either tokenizer (what the zoo stores beside a model)."""
    kind = d.get("type")
    if kind == "bytes":
        return ByteTokenizer()
    if kind == "hf":
        from tokenizers import Tokenizer

        return HFTokenizer(Tokenizer.from_str(json.dumps(d["tokenizer"])))
    raise ValueError(f"tokenizer type={kind!r}; expected 'bytes' or 'hf'")
