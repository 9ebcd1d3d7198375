"""BERTScore F1 from a local Hugging Face BERT directory, in numpy (no torch).

Zhang, Kishore, Wu, Weinberger and Artzi, "BERTScore: Evaluating Text Generation with
BERT" (ICLR 2020), as the ``bert-score`` package computes it without idf weighting or
baseline rescaling: each sentence is encoded with its special tokens by the first
``num_layers`` layers of the encoder; token embeddings are L2-normalised; precision is
the mean over candidate tokens of the best cosine with any reference token (recall the
same the other way round), where the best match may be a special token of the other
sentence but the ``[CLS]`` / ``[SEP]`` rows themselves carry weight 0 in the means
(``bert-score``'s idf dictionary with those two set to 0); F1 = 2PR / (P + R).

The directory holds ``config.json`` (``model_type`` ``bert``), ``model.safetensors``
(a ``BertModel`` or a model with a ``bert.`` prefix) and ``tokenizer.json`` or
``vocab.txt`` (+ ``tokenizer_config.json``). Nothing is downloaded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np
from scipy.special import erf


def _layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _gelu(x, kind):
    if kind in ("gelu_new", "gelu_pytorch_tanh"):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    if kind != "gelu":
        raise ValueError(f"hidden_act={kind!r} is not supported; expected gelu or gelu_new")
    return 0.5 * x * (1 + erf(x / np.sqrt(2)))


class BERTScorer:
    """``BERTScorer(model_dir, num_layers=None).f1(candidates, references) -> [n]``.

    ``num_layers``: the encoder layer whose output is used (``bert-score``'s
    ``num_layers``; default: the last layer)."""

    def __init__(self, model_dir: str, num_layers: int | None = None):
        from safetensors.numpy import load_file

        cfg_path = os.path.join(model_dir, "config.json")
        if not os.path.exists(cfg_path):
            raise FileNotFoundError(f"{model_dir}: no config.json; expected a local Hugging "
                                    "Face BERT directory")
        with open(cfg_path) as f:
            cfg = json.load(f)
        if cfg.get("model_type") != "bert":
            raise ValueError(f"{cfg_path}: model_type={cfg.get('model_type')!r}; expected "
                             "'bert'")
        self.config = cfg
        n = cfg["num_hidden_layers"]
        self.num_layers = n if num_layers is None else int(num_layers)
        if not 1 <= self.num_layers <= n:
            raise ValueError(f"num_layers={num_layers}; expected 1..{n} for {model_dir}")
        weights = os.path.join(model_dir, "model.safetensors")
        if not os.path.exists(weights):
            raise FileNotFoundError(f"{model_dir}: no model.safetensors")
        raw = load_file(weights)
        self.w = {k.removeprefix("bert."): v.astype(np.float64) for k, v in raw.items()}
        self.tokenizer, special = _load_tokenizer(model_dir)
        self.special_ids = {self.tokenizer.token_to_id(t) for t in special} - {None}
        self.max_len = cfg.get("max_position_embeddings", 512)

    def encode(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """``(ids [L], embeddings [L, hidden])`` of one sentence with special tokens."""
        ids = np.asarray(self.tokenizer.encode(text).ids[: self.max_len])
        return ids, self._forward(ids)

    def _forward(self, ids: np.ndarray) -> np.ndarray:
        w, cfg = self.w, self.config
        eps = cfg.get("layer_norm_eps", 1e-12)
        x = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][: len(ids)]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"],
                        eps)
        heads = cfg["num_attention_heads"]
        d = x.shape[-1] // heads
        lin = lambda h, name: h @ w[f"{name}.weight"].T + w[f"{name}.bias"]
        for i in range(self.num_layers):
            p = f"encoder.layer.{i}"
            q, k, v = (lin(x, f"{p}.attention.self.{n}").reshape(len(ids), heads, d)
                       .transpose(1, 0, 2) for n in ("query", "key", "value"))
            s = q @ k.transpose(0, 2, 1) / np.sqrt(d)
            s = np.exp(s - s.max(-1, keepdims=True))
            ctx = ((s / s.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(len(ids), -1)
            x = _layer_norm(lin(ctx, f"{p}.attention.output.dense") + x,
                            w[f"{p}.attention.output.LayerNorm.weight"],
                            w[f"{p}.attention.output.LayerNorm.bias"], eps)
            h = _gelu(lin(x, f"{p}.intermediate.dense"), cfg.get("hidden_act", "gelu"))
            x = _layer_norm(lin(h, f"{p}.output.dense") + x, w[f"{p}.output.LayerNorm.weight"],
                            w[f"{p}.output.LayerNorm.bias"], eps)
        return x

    def score(self, candidates: Sequence[str], references: Sequence[str]) -> np.ndarray:
        """``[n, 3]``: precision, recall, F1 per pair."""
        if len(candidates) != len(references):
            raise ValueError(f"{len(candidates)} candidates for {len(references)} references")
        cache: dict[str, tuple] = {}

        def enc(text):
            if text not in cache:
                ids, e = self.encode(text)
                cache[text] = (ids, e / np.linalg.norm(e, axis=-1, keepdims=True))
            return cache[text]

        out = np.zeros((len(candidates), 3))
        for i, (c, r) in enumerate(zip(candidates, references, strict=True)):
            (ci, ce), (ri, re_) = enc(c), enc(r)
            sim = ce @ re_.T
            wc = np.asarray([t not in self.special_ids for t in ci], np.float64)
            wr = np.asarray([t not in self.special_ids for t in ri], np.float64)
            p = (sim.max(1) * wc).sum() / max(wc.sum(), 1e-12)
            rec = (sim.max(0) * wr).sum() / max(wr.sum(), 1e-12)
            f = 2 * p * rec / (p + rec) if p + rec != 0 else 0.0
            out[i] = p, rec, f
        return out

    def f1(self, candidates: Sequence[str], references: Sequence[str]) -> np.ndarray:
        """BERTScore F1 per pair."""
        return self.score(candidates, references)[:, 2]


def _load_tokenizer(model_dir: str):
    """A ``tokenizers.Tokenizer`` that adds ``[CLS] ... [SEP]``, and the special tokens."""
    from tokenizers import Tokenizer
    from tokenizers.implementations import BertWordPieceTokenizer

    cfg = {}
    cfg_path = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.exists(cfg_path):
        with open(cfg_path) as f:
            cfg = json.load(f)
    special = [cfg.get("cls_token", "[CLS]"), cfg.get("sep_token", "[SEP]")]
    special = [t["content"] if isinstance(t, dict) else t for t in special]
    fast = os.path.join(model_dir, "tokenizer.json")
    if os.path.exists(fast):
        return Tokenizer.from_file(fast), special
    vocab = os.path.join(model_dir, "vocab.txt")
    if not os.path.exists(vocab):
        raise FileNotFoundError(f"{model_dir}: neither tokenizer.json nor vocab.txt")
    tok = BertWordPieceTokenizer(vocab, lowercase=cfg.get("do_lower_case", True))
    return tok, special
