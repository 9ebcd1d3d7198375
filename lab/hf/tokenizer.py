"""Hugging Face ``tokenizer.json`` behind the contract of ``lab.data.ByteTokenizer``.

:class:`HFTokenizer` offers ``encode(str) -> list[int]``, ``decode(ids) -> str``,
``vocab_size`` and the special ids ``pad_id``, ``bos_id``, ``eos_id``, ``sep_id``
(None where the tokenizer has no such token), so code written against
Lab's byte tokenizer runs unchanged on a real checkpoint's tokenizer. The raw
``tokenizers.Tokenizer`` is ``.tokenizer``. Only the ``tokenizers`` package is
used (no ``transformers``).

Special tokens are looked up, in order, in ``tokenizer_config.json`` (the
token strings ``transformers`` writes), ``generation_config.json`` and
``config.json`` (their ``*_token_id`` fields).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence

from tokenizers import Tokenizer


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _token_str(value) -> str | None:
    if isinstance(value, dict):  # AddedToken serialised as {"content": ..., ...}
        return value.get("content")
    return value if isinstance(value, str) else None


@dataclasses.dataclass
class HFTokenizer:
    """A ``tokenizers.Tokenizer`` with Lab's tokenizer interface.

    Attributes:
      tokenizer: the raw ``tokenizers.Tokenizer``.
      pad_id, bos_id, eos_id, sep_id: special token ids or None.
    """

    tokenizer: Tokenizer
    pad_id: int | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    sep_id: int | None = None

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (a model's embedding may be padded beyond it)."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; no BOS/EOS unless ``add_special_tokens`` (as ByteTokenizer)."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (special tokens kept unless ``skip_special_tokens``)."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)


def load_tokenizer(path: str | os.PathLike) -> HFTokenizer:
    """Returns the :class:`HFTokenizer` of a checkpoint directory (or a ``tokenizer.json`` path).

    Raises FileNotFoundError when there is no ``tokenizer.json``, and ValueError
    when a special token named in ``tokenizer_config.json`` is not in the vocabulary.
    """
    path = os.fspath(path)
    file = path if path.endswith(".json") else os.path.join(path, "tokenizer.json")
    if not os.path.isfile(file):
        raise FileNotFoundError(f"no tokenizer.json at {file!r}; lab.hf.load_tokenizer reads "
                                "the Hugging Face tokenizers format")
    tok = Tokenizer.from_file(file)
    directory = os.path.dirname(file)
    tok_config = _read_json(os.path.join(directory, "tokenizer_config.json"))
    gen_config = _read_json(os.path.join(directory, "generation_config.json"))
    model_config = _read_json(os.path.join(directory, "config.json"))
    ids = {}
    for kind in ("pad", "bos", "eos", "sep"):
        token = _token_str(tok_config.get(f"{kind}_token"))
        if token is not None:
            ids[kind] = tok.token_to_id(token)
            if ids[kind] is None:
                raise ValueError(f"tokenizer_config.json {kind}_token={token!r} is not in the "
                                 f"vocabulary of {file}")
            continue
        for source in (gen_config, model_config):
            value = source.get(f"{kind}_token_id")
            if isinstance(value, list):  # several stop ids: the first is the canonical one
                value = value[0] if value else None
            if value is not None:
                ids[kind] = int(value)
                break
    return HFTokenizer(tok, pad_id=ids.get("pad"), bos_id=ids.get("bos"), eos_id=ids.get("eos"),
                       sep_id=ids.get("sep"))
