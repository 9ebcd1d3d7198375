"""A checkpoint directory's ``tokenizer.json`` as :class:`lab.data.tokenizer.HFTokenizer`.

``lab.data`` owns the tokenizer contract Lab's code relies on (``encode(text,
add_bos=False, add_eos=False) -> list[int]``, ``decode(ids) -> str``,
``batch_encode``, ``vocab_size``, ``pad_id``/``bos_id``/``eos_id``/``sep_id``, the
raw ``tokenizers.Tokenizer`` as ``.tokenizer``); this module adds what a
Hugging Face checkpoint says about its special tokens. They are taken, in
order, from ``tokenizer_config.json`` (the token strings ``transformers``
writes), ``generation_config.json`` and ``config.json`` (their ``*_token_id``
fields); a role none of them names falls back to ``HFTokenizer``'s lookup of
the usual spellings. Only the ``tokenizers`` package is used.
"""

from __future__ import annotations

import json
import os

from tokenizers import Tokenizer

from lab.data.tokenizer import HFTokenizer


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _token_str(value) -> str | None:
    if isinstance(value, dict):  # AddedToken serialised as {"content": ..., ...}
        return value.get("content")
    return value if isinstance(value, str) else None


def special_tokens(directory: str, tok: Tokenizer) -> dict[str, str]:
    """Role (``bos``/``eos``/``pad``) -> token string, as the checkpoint's JSON files name them.

    Raises ValueError for an id outside the vocabulary.
    """
    tok_config = _read_json(os.path.join(directory, "tokenizer_config.json"))
    gen_config = _read_json(os.path.join(directory, "generation_config.json"))
    model_config = _read_json(os.path.join(directory, "config.json"))
    out = {}
    for role in ("bos", "eos", "pad"):
        token = _token_str(tok_config.get(f"{role}_token"))
        if token is not None:
            out[role] = token
            continue
        for name, source in (("generation_config.json", gen_config),
                             ("config.json", model_config)):
            value = source.get(f"{role}_token_id")
            if isinstance(value, list):  # several stop ids: the first is the canonical one
                value = value[0] if value else None
            if value is None:
                continue
            token = tok.id_to_token(int(value))
            if token is None:
                raise ValueError(f"{name} {role}_token_id={value} is outside the tokenizer's "
                                 f"vocabulary of {tok.get_vocab_size(with_added_tokens=True)}")
            out[role] = token
            break
    return out


def load_tokenizer(path: str | os.PathLike) -> HFTokenizer:
    """Returns the :class:`lab.data.tokenizer.HFTokenizer` of a checkpoint directory.

    ``path`` is the directory (or its ``tokenizer.json``). Raises
    FileNotFoundError when there is no ``tokenizer.json`` and ValueError when a
    special token the JSON files name is not in the vocabulary.
    """
    path = os.fspath(path)
    file = path if path.endswith(".json") else os.path.join(path, "tokenizer.json")
    if not os.path.isfile(file):
        raise FileNotFoundError(f"no tokenizer.json at {file!r}; lab.hf.load_tokenizer reads "
                                "the Hugging Face tokenizers format")
    tok = Tokenizer.from_file(file)
    specials = special_tokens(os.path.dirname(file), tok)
    try:
        return HFTokenizer(tok, **specials)
    except ValueError as e:
        raise ValueError(f"{os.path.dirname(file) or '.'}/tokenizer_config.json: {e}") from e
