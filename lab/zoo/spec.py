"""ZooSpec: everything that decides a zoo model's weights, and the named specs.

A spec's :meth:`ZooSpec.digest` hashes the fields that change the trained
numbers (model config, training hyper-parameters, data, sequence length,
batch size, packing, the storage format), so a changed spec gets a new cache
entry and an unchanged one is never retrained. Logging and progress fields of
the training config are left out of the hash.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from lab.data import ByteTokenizer
from lab.data.synthetic import GENERATORS
from lab.nn import TransformerConfig

ZOO_FORMAT = 3  # bump when the stored layout or the generators' output changes
UNHASHED_TRAIN_KEYS = ("progress", "log_every", "eval_every", "checkpoint_every",
                       "keep_checkpoints")
DATA_KEYS = ("tasks", "n_train", "n_eval", "seed")


def canonical(value: Any) -> Any:
    """JSON-ready form with tuples as lists and mapping keys sorted (for hashing)."""
    if isinstance(value, Mapping):
        return {str(k): canonical(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    return value


def digest_of(fields: Mapping) -> str:
    """First 12 hex digits of the SHA-256 of ``fields`` as sorted, compact JSON: the key
    digest of every zoo spec (text and VLM)."""
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclasses.dataclass(frozen=True)
class ZooSpec:
    """A small LM that Lab trains on synthetic tasks and caches.

    name:       the cache entry's prefix (``<name>-<digest>``); not hashed.
    model:      the :class:`lab.nn.TransformerConfig` (``vocab_size`` >= 264, the
                byte tokenizer's).
    train:      keyword arguments of ``lab.train.TrainConfig`` (steps, learning_rate, ...).
    data:       ``{"tasks": {generator: kwargs (+ "weight")}, "n_train": int,
                "n_eval": int (held-out examples per task), "seed": int}`` for
                :func:`lab.data.mixture`.
    seq_len:    tokens per training row.
    batch_size: rows per step.
    pack:       pack several examples per row (:func:`lab.data.batching.packed_sft_batches`).
    prompt_weight: loss weight of prompt tokens (completion tokens weigh 1).
    init:       a named zoo model (:data:`NAMED`) whose trained weights start this
                one's training (fine-tuning; the same ``model`` config); "" = random
                initialisation. Hashed as the base's cache key, so a changed base
                retrains its fine-tunes.
    description: free text for ``zoo.list()``; not hashed.
    regime:     None, or the :class:`lab.zoo.reasoning.RegimeConfig` fields to override
                (``{}``: the defaults): after training, measure the chain-of-thought
                regime on the mixture's arithmetic task and store it in the metrics
                under ``"regime"``. Not hashed (it changes no weight).
    """

    name: str
    model: TransformerConfig
    train: Mapping[str, Any]
    data: Mapping[str, Any]
    seq_len: int = 256
    batch_size: int = 16
    pack: bool = True
    prompt_weight: float = 0.0
    init: str = ""
    description: str = ""
    regime: Mapping[str, Any] | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise ValueError(f"ZooSpec.name={self.name!r}; expected a non-empty name without '/'")
        if isinstance(self.model, Mapping):
            object.__setattr__(self, "model", TransformerConfig(**self.model))
        if not isinstance(self.model, TransformerConfig):
            raise ValueError(f"ZooSpec.model={self.model!r}; expected a TransformerConfig")
        if self.model.vocab_size < ByteTokenizer.vocab_size:
            raise ValueError(f"ZooSpec.model.vocab_size={self.model.vocab_size}; the byte "
                             f"tokenizer needs >= {ByteTokenizer.vocab_size}")
        for name in ("seq_len", "batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"ZooSpec.{name}={v!r}; expected a positive int")
        if self.seq_len > self.model.max_len:
            raise ValueError(f"ZooSpec.seq_len={self.seq_len} exceeds model.max_len="
                             f"{self.model.max_len}")
        missing = [k for k in DATA_KEYS if k not in self.data]
        unknown = [k for k in self.data if k not in DATA_KEYS]
        if missing or unknown:
            raise ValueError(f"ZooSpec.data keys: missing {missing}, unknown {unknown}; "
                             f"expected exactly {DATA_KEYS}")
        for task in self.data["tasks"]:
            if task not in GENERATORS:
                raise ValueError(f"ZooSpec.data['tasks'] has unknown task {task!r}; expected "
                                 f"any of {sorted(GENERATORS)}")
        if "steps" not in self.train:
            raise ValueError("ZooSpec.train has no 'steps'")
        if self.regime is not None:
            if not isinstance(self.regime, Mapping):
                raise ValueError(f"ZooSpec.regime={self.regime!r}; expected None or a mapping "
                                 "of RegimeConfig fields")
            if "arithmetic" not in self.data["tasks"]:
                raise ValueError(f"ZooSpec.regime is set but data['tasks'] "
                                 f"{sorted(self.data['tasks'])} has no 'arithmetic', the task "
                                 "the regime is measured on")
            from lab.zoo.reasoning import RegimeConfig

            RegimeConfig.from_mapping(self.regime)  # raises ValueError naming a bad field

    def base(self) -> ZooSpec | None:
        """The spec of :attr:`init` (None without one); raises ValueError for an unknown
        name or a different model config."""
        if not self.init:
            return None
        if self.init not in NAMED:
            raise ValueError(f"ZooSpec.init={self.init!r} is unknown; expected one of "
                             f"{sorted(NAMED)}")
        base = NAMED[self.init]
        if base.model != self.model:
            raise ValueError(f"ZooSpec.init={self.init!r} has another model config; a "
                             "fine-tune keeps its base's architecture")
        return base

    def hashed_fields(self) -> dict:
        train = {k: v for k, v in self.train.items() if k not in UNHASHED_TRAIN_KEYS}
        # attention_impl picks a kernel at run time and changes no weight; it is hashed as
        # its former default so that the keys of existing entries stay.
        model = {**self.model.to_dict(), "attention_impl": "xla"}
        fields = {"format": ZOO_FORMAT, "model": model, "train": train,
                  "data": dict(self.data), "seq_len": self.seq_len,
                  "batch_size": self.batch_size, "pack": self.pack,
                  "prompt_weight": self.prompt_weight, "tokenizer": "bytes"}
        if self.init:  # only when set: specs without a base keep their digests
            fields["init"] = self.base().key
        return canonical(fields)

    def digest(self) -> str:
        """First 12 hex digits of the SHA-256 of :meth:`hashed_fields` as sorted JSON."""
        return digest_of(self.hashed_fields())

    @property
    def key(self) -> str:
        """The cache entry's directory name, ``<name>-<digest>``."""
        return f"{self.name}-{self.digest()}"

    def to_dict(self) -> dict:
        out = {"name": self.name, "model": self.model.to_dict(),
               "train": canonical(dict(self.train)), "data": canonical(dict(self.data)),
               "seq_len": self.seq_len, "batch_size": self.batch_size, "pack": self.pack,
               "prompt_weight": self.prompt_weight, "init": self.init,
               "description": self.description}
        if self.regime is not None:  # only when set: other specs' spec.json stay as they were
            out["regime"] = canonical(dict(self.regime))
        return out

    @classmethod
    def from_dict(cls, d: Mapping) -> ZooSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"ZooSpec fields {unknown} are unknown; expected {sorted(known)}")
        return cls(**{**d, "model": TransformerConfig(**d["model"])})

    def replace(self, **kwargs) -> ZooSpec:
        return dataclasses.replace(self, **kwargs)


def byte_lm(d_model: int, n_layers: int, n_heads: int, n_kv_heads: int, d_ff: int,
            max_len: int, qk_smear: int = 0) -> TransformerConfig:
    """A Transformer over the byte tokenizer's vocabulary (head_dim = d_model / n_heads;
    ``qk_smear``: see :class:`lab.nn.TransformerConfig`)."""
    return TransformerConfig(vocab_size=ByteTokenizer.vocab_size, d_model=d_model,
                             n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                             head_dim=d_model // n_heads, d_ff=d_ff, max_len=max_len,
                             qk_smear=qk_smear)


def _tasks(context: tuple[int, int] = (128, 448)) -> dict:
    """The named models' mixture: recall (copy, MQAR), then the long-context tasks (needles,
    variable tracking, multi-document QA) and arithmetic. Copy grows induction heads; MQAR
    gives key lookup many training signals per example (:mod:`lab.data.synthetic.recall`).
    A small model learns its lookup from this mixture with ``qk_smear`` and after a
    copy-only stage (``lm-xs-copy``); docs/zoo.md has the measurements."""
    return {
        "copy": {"weight": 1, "length": (8, 32)},
        "associative_recall": {"weight": 2, "n_pairs": (8, 32), "n_queries": (2, 6)},
        "needle": {"weight": 1, "context_len": context, "n_needles": 3},
        "variable_tracking": {"weight": 1, "hops": (1, 3), "context_len": context,
                              "n_chains": 3},
        "kv_retrieval": {"weight": 1, "n_docs": (4, 24), "pairs_per_doc": 1},
        "arithmetic": {"weight": 1, "steps": (1, 3), "digits": (1, 2)},
    }


def train_recipe(steps: int, learning_rate: float, **overrides) -> dict:
    """The zoo's training recipe (``lab.train.TrainConfig`` fields): AdamW, weight decay
    0.01, clip 1.0, warm-up min(100, steps / 10) then cosine, held-out exact match logged
    every 250 steps; ``overrides`` replace any field."""
    return {"steps": steps, "learning_rate": learning_rate,
            "warmup_steps": min(100, steps // 10), "schedule": "cosine", "optimizer": "adamw",
            "weight_decay": 0.01, "grad_clip": 1.0, "seed": 0, "log_every": 25,
            "checkpoint_every": 200, "eval_every": 250, **overrides}


def spec_from_config(block: Mapping, tasks: Mapping, *, seed: int, description: str = "",
                     **train_overrides) -> ZooSpec:
    """The :class:`ZooSpec` of a launcher's ``config.zoo`` block, for experiments whose own LM
    is described by a few architecture and training numbers rather than a named model.

    ``block`` holds ``name``, the :func:`byte_lm` fields (``d_model``, ``n_layers``,
    ``n_heads``, ``n_kv_heads``, ``d_ff``, ``max_len``, ``qk_smear``), ``steps``,
    ``learning_rate``, ``n_train``, ``n_eval``, ``seq_len``, ``batch_size`` and optionally
    ``prompt_weight`` (default 0) and ``init`` (default ""). ``tasks`` is the mixture
    (``data["tasks"]``), ``seed`` the data's and the training's seed, and
    ``train_overrides`` replace fields of :func:`train_recipe`.
    """
    model = byte_lm(block["d_model"], block["n_layers"], block["n_heads"], block["n_kv_heads"],
                    block["d_ff"], block["max_len"], block["qk_smear"])
    train = train_recipe(block["steps"], block["learning_rate"],
                         **{"seed": seed, **train_overrides})
    data = {"tasks": dict(tasks), "n_train": block["n_train"], "n_eval": block["n_eval"],
            "seed": seed}
    return ZooSpec(name=block["name"], model=model, train=train, data=data,
                   seq_len=block["seq_len"], batch_size=block["batch_size"], pack=True,
                   prompt_weight=block.get("prompt_weight", 0.0), init=block.get("init", ""),
                   description=description)


# lm-xs's architecture, shared by its fine-tunes (a fine-tune keeps its base's model config).
_LM_XS = byte_lm(128, 2, 4, 2, 384, 2048, qk_smear=5)
_LM_S = byte_lm(192, 3, 6, 2, 576, 2048, qk_smear=5)


def _docs_tune(name: str, steps: int, seed: int, gold_bias: str, description: str) -> ZooSpec:
    """lm-xs fine-tuned on multi-document QA whose gold document is drawn with ``gold_bias``
    (:func:`lab.data.synthetic.kv_retrieval`), plus copy against forgetting."""
    return ZooSpec(
        name=name, model=_LM_XS,
        train=train_recipe(steps, 1e-3, seed=seed, eval_every=min(100, steps // 2)),
        data={"tasks": {"kv_retrieval": {"weight": 3, "n_docs": (4, 24), "pairs_per_doc": 1,
                                         "gold_bias": gold_bias},
                        "copy": {"weight": 1, "length": (8, 32)}},
              "n_train": 6000, "n_eval": 64, "seed": seed},
        seq_len=512, batch_size=8, init="lm-xs", description=description)


def _copy_stage(base: str, model: TransformerConfig, learning_rate: float) -> ZooSpec:
    """``<base>-copy``, the first stage of ``base``: 600 steps of copy alone (rows of 512).

    600 copy steps form the induction circuit, where the mixture (or copy with MQAR) holds
    the model on its plateau, and from it the mixture learns its lookup within a few hundred
    steps (:mod:`lab.data.synthetic.copy`; measurements in docs/zoo.md).
    """
    return ZooSpec(
        name=f"{base}-copy", model=model,
        train=train_recipe(600, learning_rate, eval_every=100),
        data={"tasks": {"copy": {"length": (8, 32)}}, "n_train": 20000, "n_eval": 64,
              "seed": 0},
        seq_len=512, batch_size=8,
        description=(f"{base}'s first stage: copy only, which grows the induction circuit "
                     f"that {base}'s lookup builds on"))


# The reasoning zoo's task: lab.data's multi-step arithmetic chains of 1-5 steps on two-digit
# operands, where every level has prompts outside the training set (one-digit one-step sums
# are only 162 prompts, all of them seen in training); 5 steps, not 4, so that the hardest
# level stays hard for the largest size (docs/zoo.md).
COT_TASK = {"arithmetic": {"steps": (1, 5), "digits": 2, "ops": "+-"}}
# The first stage's task: the same chains with one- and two-digit operands. A model trained
# on two-digit chains from scratch sits on a plateau (format right, sums wrong) for a number
# of steps that varies by size and seed; after this stage it leaves the plateau within a few
# hundred steps of the second (docs/zoo.md has the recipes tried).
COT_WARMUP_TASK = {"arithmetic": {"steps": (1, 5), "digits": (1, 2), "ops": "+-"}}
COT_SEQ_LEN = 128  # packed rows; the longest example (5 steps, 3-digit partials) is 90 tokens


def cot_specs(name: str, model: TransformerConfig, steps: tuple[int, int],
              learning_rate: float, description: str, *, batch_size: int = 32,
              n_train: int = 60000, seed: int = 0) -> dict[str, ZooSpec]:
    """A chain-of-thought solver of :data:`COT_TASK` in two stages, ``{name}-digits`` then
    ``name``: ``steps[0]`` updates on :data:`COT_WARMUP_TASK`, then ``steps[1]`` on
    :data:`COT_TASK` from the first stage's weights, each a :func:`train_recipe` of
    ``batch_size`` packed rows of :data:`COT_SEQ_LEN` tokens (the second with 100 warm-up
    steps whatever its length, as the recipe gives 1,000 steps or more); the second stage's regime
    (:mod:`lab.zoo.reasoning`) is measured after training."""
    def stage(stage_name, n_steps, tasks, init, regime, text, **train):
        return ZooSpec(
            name=stage_name, model=model,
            train=train_recipe(n_steps, learning_rate, seed=seed,
                               eval_every=max(n_steps // 4, 1), checkpoint_every=500, **train),
            data={"tasks": tasks, "n_train": n_train, "n_eval": 64, "seed": seed},
            seq_len=COT_SEQ_LEN, batch_size=batch_size, init=init, regime=regime,
            description=text)

    first = stage(f"{name}-digits", steps[0], COT_WARMUP_TASK, "", None,
                  f"{name}'s first stage: chains on one- and two-digit operands")
    return {first.name: first,
            name: stage(name, steps[1], COT_TASK, first.name, {}, description,
                        warmup_steps=100)}


NAMED: dict[str, ZooSpec] = {
    "lm-test": ZooSpec(
        name="lm-test", model=byte_lm(32, 1, 2, 1, 64, 64),
        train=train_recipe(40, 3e-3, checkpoint_every=0, eval_every=20),
        data={"tasks": {"arithmetic": {"steps": 1, "digits": 1}}, "n_train": 256,
              "n_eval": 32, "seed": 0},
        seq_len=64, batch_size=8,
        description="tiny, for tests: one-step one-digit arithmetic; trains in seconds"),
    "lm-xs-copy": _copy_stage("lm-xs", _LM_XS, 3e-3),
    "lm-xs": ZooSpec(
        name="lm-xs", model=_LM_XS,
        train=train_recipe(800, 3e-3, eval_every=100),
        data={"tasks": _tasks((128, 960)), "n_train": 40000, "n_eval": 64, "seed": 0},
        seq_len=1024, batch_size=8, init="lm-xs-copy",
        description=("2 layers, d=128 (0.43M params), q/k smeared over 5 tokens, contexts up to "
                     "960 tokens, trained 800 steps from lm-xs-copy; the base of the lm-xs-* "
                     "fine-tunes")),
    # lm-xs fine-tuned to favour early documents: multi-document QA whose gold document is
    # drawn with probability falling linearly over the slots (and copy, against forgetting).
    # A model with another position bias: GOLD PANNING's calibration-mismatch run measures the
    # profile on it and deploys on lm-xs-docs.
    "lm-xs-early": _docs_tune(
        "lm-xs-early", 300, seed=1, gold_bias="early",
        description="lm-xs fine-tuned 300 steps on multi-document QA with early gold documents, "
                    "GOLD PANNING's calibration-mismatch model"),
    # lm-xs fine-tuned on multi-document QA whose gold document sits more often at either end
    # ("lost in the middle"): GOLD PANNING's model (docs/zoo.md: how strong a reader it is).
    "lm-xs-docs": _docs_tune(
        "lm-xs-docs", 100, seed=3, gold_bias="ends",
        description="lm-xs fine-tuned 100 steps on multi-document QA with gold documents "
                    "favoured at both ends, GOLD PANNING's model"),
    # lm-xs fine-tuned on PRKV's evaluation tasks at PRKV's lengths (512-960 tokens), where
    # lm-xs's mixture spreads over 128-960 and 6 tasks, so that the model solves PRKV's
    # prompts at full cache well enough for eviction to lose something (docs/zoo.md).
    "lm-xs-long": ZooSpec(
        name="lm-xs-long", model=_LM_XS,
        train=train_recipe(1500, 1e-3, seed=2, eval_every=100),
        data={"tasks": {
            "needle": {"weight": 3, "context_len": (512, 960), "n_needles": 3},
            "variable_tracking": {"weight": 2, "hops": (1, 3), "context_len": (512, 960),
                                  "n_chains": 3},
            "arithmetic": {"weight": 2, "steps": (1, 3), "digits": 1, "ops": "+-"},
            "copy": {"weight": 1, "length": (8, 32)}},
            "n_train": 16000, "n_eval": 64, "seed": 2},
        seq_len=1024, batch_size=8, init="lm-xs",
        description=("lm-xs fine-tuned 1,500 steps on needles, variable tracking (512-960 "
                     "tokens) and one-digit arithmetic, PRKV's model")),
    "lm-s-copy": _copy_stage("lm-s", _LM_S, 2e-3),
    "lm-s": ZooSpec(
        name="lm-s", model=_LM_S,
        train=train_recipe(1000, 2e-3, eval_every=100),
        data={"tasks": _tasks(), "n_train": 60000, "n_eval": 64, "seed": 0},
        seq_len=512, batch_size=12, init="lm-s-copy",
        description=("3 layers, d=192 (1.3M params), q/k smeared over 5 tokens, contexts up to "
                     "448 tokens, trained 1,000 steps from lm-s-copy")),
    "lm-m": ZooSpec(
        name="lm-m", model=byte_lm(256, 4, 8, 2, 768, 4096, qk_smear=5),
        train=train_recipe(8000, 1.5e-3),
        data={"tasks": _tasks((256, 1920)), "n_train": 120000, "n_eval": 64, "seed": 0},
        seq_len=2048, batch_size=8,
        description="4 layers, d=256 (3.1M params), contexts up to 1920 tokens (a GPU host)"),
    # The reasoning zoo (lab.zoo.reasoning): chain-of-thought solvers of two-digit arithmetic
    # chains at three widths, a student, a teacher and a pool between; cot-m's second stage is
    # shorter, which keeps its hardest level hard. docs/zoo.md has their accuracy by
    # difficulty, pass@k, training times and every recipe tried.
    **cot_specs(
        "cot-xs", byte_lm(64, 2, 4, 2, 256, COT_SEQ_LEN), (500, 1200), 3e-3,
        "2 layers, d=64: the reasoning zoo's student (arithmetic chains of 1-5 two-digit "
        "steps)"),
    **cot_specs(
        "cot-s", byte_lm(80, 2, 4, 2, 320, COT_SEQ_LEN), (500, 1200), 3e-3,
        "2 layers, d=80: the reasoning zoo's middle size"),
    **cot_specs(
        "cot-m", byte_lm(96, 2, 4, 2, 384, COT_SEQ_LEN), (500, 750), 3e-3,
        "2 layers, d=96: the reasoning zoo's teacher"),
}
