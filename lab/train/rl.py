"""GRPO-style RL fine-tuning: sample a group per prompt, score, update on group-relative advantages.

One RL step of :class:`RLTrainer` (``RLTrainer(model, tokenizer, config).fit(dataset)``):

1. **Sample.** ``prompts_per_step`` rows of the dataset (:func:`lab.data.step_indices`,
   so step ``s`` always sees the same rows), each prompt repeated ``group_size`` times,
   decoded by :func:`lab.infer.generate` at ``temperature`` / ``top_p`` / ``top_k`` until
   the tokenizer's EOS or ``max_new_tokens``.
2. **Score.** The reward functions named in the config (:mod:`lab.train.rewards`) score
   the decoded completions; a completion without an answer gets the function's failure
   reward and is counted (``no_answer``).
3. **Advantages.** :func:`grpo_advantages` over the groups named by ``group_by``
   (``"prompt"``, or a dataset column such as ``"template"`` or ``"task"``), scaled per
   task by the success hook (below).
4. **Update.** ``epochs`` passes over the rollout, each in ``minibatches`` optimizer
   updates, of :func:`lab.train.policy_gradient_loss`: the clipped ratio (DAPO's
   clip-higher with ``clip_eps_high``), token- or sequence-level aggregation, and a KL
   penalty to the frozen reference (the model as ``fit`` first received it) with the
   k1 or k3 estimator. The updates run through the Trainer's jitted step
   (:func:`lab.train.compiled_step`), so optimizers, clipping and precision are the
   Trainer's.
5. **Controllers.** With ``kl_target`` the KL coefficient follows the adaptive
   controller of Ziegler et al. 2019 ("Fine-Tuning Language Models from Human
   Preferences", sec. 2.2): ``e = clip(KL / target - 1, -0.2, 0.2)``, ``beta <- beta *
   (1 + e / kl_horizon)``. A success hook maps the per-task success rates (an
   exponential moving average of ``reward >= success_threshold``) to per-task
   multipliers of the advantages or of the KL coefficient (:class:`SuccessScaling`).

The formulas, against trl's ``GRPOTrainer`` (``trl/trainer/grpo_trainer.py``) and the
papers:

* advantages (GRPO, Shao et al. 2024, DeepSeekMath, sec. 4.1.2, outcome supervision):
  ``A_i = (r_i - mean(r_group)) / (std(r_group) + eps)``, trl's ``scale_rewards="group"``
  with ``std`` the Bessel-corrected one and ``eps = 1e-4``; ``"batch"`` divides by the
  std of the whole batch instead, ``"none"`` only centres (Dr. GRPO);
* the objective per token (GRPO eq. 3; DAPO, Yu et al. 2025, ``J_DAPO``):
  ``min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) - beta KL`` with
  ``r = pi / pi_old``; ``aggregation="sequence"`` averages each completion's tokens and
  then the completions (GRPO eq. 3, trl ``loss_type="grpo"``), ``"token"`` averages all
  completion tokens of the batch at once (DAPO's token-level loss, trl ``"bnpo"``, and
  ``"dapo"`` when the batch is one update);
* KL (GRPO eq. 4 = Schulman 2020, "Approximating KL divergence", ``k3``):
  ``pi_ref / pi - log(pi_ref / pi) - 1``, or ``k1 = log(pi / pi_ref)``.

The policy's log-probabilities are taken at the sampling temperature,
``log softmax(logits / temperature)`` (as trl's ``_get_per_token_logps``), so the
gradient is that of the distribution the completions were drawn from (top-p / top-k
truncation aside, as in trl), and the ratio is 1 on the first update of each rollout.

With a ``workdir`` the run writes ``metrics.jsonl`` (one record per ``log_every``
steps: reward, per-function rewards, success, no_answer, KL, clip fractions,
completion length, ...) and orbax checkpoints (:class:`lab.train.RunCheckpoints`:
parameters, optimizer state, the reference, the controllers' state), and a new
``fit`` in the same workdir resumes from the newest intact checkpoint and ends with
the same parameters and metrics as an uninterrupted run (CPU).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx
from tqdm.auto import tqdm

from lab import infer
from lab.data import step_indices
from lab.train import rewards as rewards_lib
from lab.train.checkpoint import RunCheckpoints
from lab.train.config import TrainConfig, make_optimizer
from lab.train.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    logprobs_from_logits,
    policy_gradient_loss,
)
from lab.train.runlog import due, log_update, truncate_metrics
from lab.train.step import compiled_step, step_config

SCALE_REWARDS = ("group", "batch", "none")
SUCCESS_MODES = ("advantage", "kl")
# TrainConfig fields that RLConfig passes through to the optimizer.
_OPTIM_FIELDS = ("learning_rate", "warmup_steps", "schedule", "optimizer", "weight_decay",
                 "grad_clip", "b1", "b2", "precision")


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """Hyper-parameters of :class:`RLTrainer` (names follow trl's ``GRPOConfig`` where one
    exists: ``num_generations`` = ``group_size``, ``epsilon`` = ``clip_eps``,
    ``epsilon_high`` = ``clip_eps_high``, ``beta`` = ``kl_coef``, ``num_iterations`` =
    ``epochs``).

    steps:             RL steps (sample, score, update).
    prompts_per_step:  distinct prompts per step; the rollout has
                       ``prompts_per_step * group_size`` completions.
    group_size:        completions sampled per prompt (G >= 2 when advantages are scaled
                       by a group std, ``scale_rewards="group"``).
    max_new_tokens:    completion budget; a completion that reaches it is truncated.
    temperature, top_p, top_k: the sampling of :func:`lab.infer.generate`.
    max_prompt_len:    prompts are right-padded to this many tokens, so every step runs
                       one compiled program; None = the longest prompt of the dataset.
    add_bos:           prepend the tokenizer's BOS to prompts (as the zoo trains them).
    rewards:           registered reward names (:mod:`lab.train.rewards`).
    reward_weights:    one weight per reward (None = 1 each).
    group_by:          what a group is: ``"prompt"`` (its G samples) or a dataset column
                       (``"template"``, ``"task"``): rows with equal values share a group.
    scale_rewards:     ``"group"`` | ``"batch"`` | ``"none"`` (see :func:`grpo_advantages`).
    adv_eps:           added to the std (trl: 1e-4).
    epochs:            optimisation passes over each rollout (GRPO's mu).
    minibatches:       updates per pass (the rollout is split, shuffled per pass).
    clip_eps, clip_eps_high: the ratio clip below / above 1 (None = symmetric).
    aggregation:       ``"sequence"`` (GRPO) or ``"token"`` (DAPO).
    kl_coef:           initial KL weight (beta); 0 with no ``kl_target`` = no reference.
    kl_estimator:      ``"k1"`` or ``"k3"``.
    kl_target:         None, or the KL the adaptive controller steers to (needs
                       ``kl_coef > 0``).
    kl_horizon:        the controller's horizon (steps).
    success_threshold: a completion with ``reward >= success_threshold`` is a success.
    success_ema:       weight of the old value in the per-task success-rate average.
    seed:              sampling and shuffling seed.
    log_every, eval_every, checkpoint_every, keep_checkpoints, progress: as
                       :class:`lab.train.TrainConfig`'s, counted in RL steps.
    learning_rate, warmup_steps, schedule, optimizer, weight_decay, grad_clip, b1, b2,
    precision:         the optimizer, as :class:`lab.train.TrainConfig`'s (its schedule
                       runs over ``steps * epochs * minibatches`` updates).
    """

    steps: int = 100
    prompts_per_step: int = 8
    group_size: int = 8
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    max_prompt_len: int | None = None
    add_bos: bool = True
    rewards: tuple[str, ...] = ("exact_match",)
    reward_weights: tuple[float, ...] | None = None
    group_by: str = "prompt"
    scale_rewards: str = "group"
    adv_eps: float = 1e-4
    epochs: int = 1
    minibatches: int = 1
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    aggregation: str = "sequence"
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_target: float | None = None
    kl_horizon: float = 10.0
    success_threshold: float = 1.0
    success_ema: float = 0.9
    seed: int = 0
    log_every: int = 1
    eval_every: int = 0
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    progress: bool = True
    learning_rate: float = 1e-4
    warmup_steps: int = 0
    schedule: str = "constant"
    optimizer: str = "adamw"
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    b1: float = 0.9
    b2: float = 0.999
    precision: str = "float32"

    def __post_init__(self):
        def fail(name, expected):
            raise ValueError(f"RLConfig.{name}={getattr(self, name)!r}; expected {expected}")

        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)

        def is_num(v):
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        for name, low in (("steps", 0), ("prompts_per_step", 1), ("group_size", 1),
                          ("max_new_tokens", 1), ("epochs", 1), ("minibatches", 1),
                          ("log_every", 1), ("eval_every", 0), ("checkpoint_every", 0),
                          ("keep_checkpoints", 1)):
            v = getattr(self, name)
            if not is_int(v) or v < low:
                fail(name, f"an int >= {low}")
        if not is_int(self.seed):
            fail("seed", "an int")
        if self.max_prompt_len is not None and (not is_int(self.max_prompt_len)
                                                or self.max_prompt_len < 1):
            fail("max_prompt_len", "None or an int >= 1")
        if not is_num(self.temperature) or self.temperature < 0:
            fail("temperature", "a number >= 0 (0 = greedy)")
        if self.top_p is not None and (not is_num(self.top_p) or not 0 < self.top_p <= 1):
            fail("top_p", "None or a number in (0, 1]")
        if self.top_k is not None and (not is_int(self.top_k) or self.top_k < 1):
            fail("top_k", "None or an int >= 1")
        if not isinstance(self.add_bos, bool):
            fail("add_bos", "a bool")
        if not isinstance(self.progress, bool):
            fail("progress", "a bool")
        object.__setattr__(self, "rewards", tuple(self.rewards) if not isinstance(
            self.rewards, str) else (self.rewards,))
        if not self.rewards or not all(isinstance(r, str) and r for r in self.rewards):
            fail("rewards", "a non-empty tuple of registered reward names")
        if self.reward_weights is not None:
            object.__setattr__(self, "reward_weights", tuple(self.reward_weights))
            if len(self.reward_weights) != len(self.rewards) or not all(
                    is_num(w) for w in self.reward_weights):
                fail("reward_weights", f"None or {len(self.rewards)} finite numbers, one per "
                     "reward")
        if not isinstance(self.group_by, str) or not self.group_by:
            fail("group_by", "'prompt' or the name of a dataset column")
        if self.scale_rewards not in SCALE_REWARDS:
            fail("scale_rewards", f"one of {SCALE_REWARDS}")
        if self.scale_rewards == "group" and self.group_by == "prompt" and self.group_size < 2:
            fail("group_size", "an int >= 2: scale_rewards='group' divides by the std of each "
                 "prompt's group, which needs at least 2 samples")
        if not is_num(self.adv_eps) or self.adv_eps < 0:
            fail("adv_eps", "a number >= 0")
        if (self.prompts_per_step * self.group_size) % self.minibatches:
            fail("minibatches", f"a divisor of prompts_per_step * group_size = "
                 f"{self.prompts_per_step * self.group_size}")
        if not is_num(self.clip_eps) or not 0 <= self.clip_eps < 1:
            fail("clip_eps", "a number in [0, 1)")
        if self.clip_eps_high is not None and (not is_num(self.clip_eps_high)
                                               or self.clip_eps_high < 0):
            fail("clip_eps_high", "None or a number >= 0")
        if self.aggregation not in AGGREGATIONS:
            fail("aggregation", f"one of {AGGREGATIONS}")
        if self.kl_estimator not in KL_ESTIMATORS:
            fail("kl_estimator", f"one of {KL_ESTIMATORS}")
        if not is_num(self.kl_coef) or self.kl_coef < 0:
            fail("kl_coef", "a number >= 0")
        if self.kl_target is not None:
            if not is_num(self.kl_target) or self.kl_target <= 0:
                fail("kl_target", "None or a number > 0")
            if self.kl_coef <= 0:
                fail("kl_coef", "a number > 0 when kl_target is set (the adaptive controller "
                     "scales it)")
        if not is_num(self.kl_horizon) or self.kl_horizon < 1:
            fail("kl_horizon", "a number >= 1")
        if not is_num(self.success_threshold):
            fail("success_threshold", "a finite number")
        if not is_num(self.success_ema) or not 0 <= self.success_ema < 1:
            fail("success_ema", "a number in [0, 1)")
        try:
            self.train_config()
        except ValueError as e:
            raise ValueError(str(e).replace("TrainConfig.", "RLConfig.")) from None

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef > 0

    @property
    def batch_size(self) -> int:
        """Completions per rollout."""
        return self.prompts_per_step * self.group_size

    def train_config(self) -> TrainConfig:
        """The :class:`TrainConfig` of the optimizer (one update per minibatch)."""
        return TrainConfig(steps=max(self.steps * self.epochs * self.minibatches, 1),
                           grad_accum=1, seed=self.seed, progress=False,
                           **{k: getattr(self, k) for k in _OPTIM_FIELDS})

    def replace(self, **kwargs) -> RLConfig:
        return dataclasses.replace(self, **kwargs)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RLConfig:
        d = dict(d.to_dict() if hasattr(d, "to_dict") else d)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"RLConfig: unknown keys {unknown}; known keys: {sorted(known)}")
        return cls(**d)


# ----------------------------------------------------------------------------- pure parts


@functools.partial(jax.jit, static_argnames=("scale",))
def grpo_advantages(rewards: jax.Array, group_ids: jax.Array, *, scale: str = "group",
                    eps: float = 1e-4) -> jax.Array:
    """Group-relative advantages, trl ``GRPOTrainer``'s formula.

    ``A_i = (r_i - mean_g) / (std + eps)`` where ``mean_g`` is the mean reward of i's
    group and ``std`` the Bessel-corrected (``ddof=1``, torch's ``std``) standard
    deviation of i's group (``scale="group"``; GRPO, Shao et al. 2024, sec. 4.1.2) or
    of the whole batch (``"batch"``); ``"none"`` returns ``r_i - mean_g`` (Dr. GRPO).
    A group with one member has std 0 here (the caller refuses it for ``"group"``).

    Args:
      rewards: ``[N]``; group_ids: ``[N]`` ints, any values (equal = same group).
    """
    r = jnp.asarray(rewards, jnp.float32)
    same = (group_ids[:, None] == group_ids[None, :]).astype(jnp.float32)
    count = jnp.sum(same, axis=1)
    mean = same @ r / count
    centred = r - mean
    if scale == "none":
        return centred
    if scale == "group":
        ss = jnp.sum(same * (r[None, :] - mean[:, None]) ** 2, axis=1)
        std = jnp.sqrt(ss / jnp.maximum(count - 1.0, 1.0))
    else:
        n = r.shape[0]
        std = jnp.full_like(r, jnp.sqrt(jnp.sum((r - jnp.mean(r)) ** 2) / max(n - 1, 1)))
    return centred / (std + eps)


def adaptive_kl(kl_coef: float, kl: float, target: float, horizon: float,
                n_steps: int = 1) -> float:
    """Ziegler et al. 2019's adaptive KL coefficient (their sec. 2.2, the
    ``AdaptiveKLController`` of OpenAI's ``lm-human-preferences`` and trl's PPO):
    ``e = clip(kl / target - 1, -0.2, 0.2)``; returns ``kl_coef * (1 + e * n_steps /
    horizon)``."""
    error = min(max(kl / target - 1.0, -0.2), 0.2)
    return kl_coef * (1.0 + error * n_steps / horizon)


@dataclasses.dataclass(frozen=True)
class GRPOLoss:
    """The Trainer ``loss_fn`` of one RL update.

    Batch: ``inputs``/``targets`` ``[B, T]`` (prompt + completion, shifted by one),
    ``valid`` ``[B, T]`` (True on real input tokens), ``mask`` ``[B, T]`` (1 on completion
    targets), ``advantages`` ``[B]``, ``kl_coef`` ``[B]`` (per-sequence beta, so the
    controllers change numbers, not the compiled program), and ``old_logp`` /
    ``ref_logp`` ``[B, T]`` when used. Returns :func:`lab.train.policy_gradient_loss`'s
    ``(loss, metrics)``.
    """

    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    kl_estimator: str = "k3"
    aggregation: str = "sequence"
    temperature: float = 1.0

    def __call__(self, model, batch: dict) -> tuple[jax.Array, dict]:
        logp = _tempered_logprobs(model, batch["inputs"], batch["targets"], batch["valid"],
                                  self.temperature)
        return policy_gradient_loss(
            logp, batch.get("old_logp"), batch.get("ref_logp"), batch["advantages"],
            batch["mask"], clip_eps=self.clip_eps, clip_eps_high=self.clip_eps_high,
            kl_coef=batch["kl_coef"] if "ref_logp" in batch else 0.0,
            kl_estimator=self.kl_estimator, aggregation=self.aggregation)


def _tempered_logprobs(model, inputs, targets, valid, temperature: float):
    """``log softmax(logits / temperature)[targets]``: the sampling distribution's
    log-probabilities (trl's ``_get_per_token_logps`` divides by the temperature too)."""
    logits = model(inputs, mask=valid)
    if temperature not in (0.0, 1.0):
        logits = logits.astype(jnp.float32) / temperature
    return logprobs_from_logits(logits, targets)


@functools.partial(jax.jit, static_argnums=(0, 5))
def _logprobs_jit(graphdef, states, inputs, targets, valid, temperature):
    return _tempered_logprobs(nnx.merge(graphdef, *states), inputs, targets, valid, temperature)


def sequence_logprobs(model, batch: Mapping[str, np.ndarray],
                      temperature: float = 1.0) -> jax.Array:
    """``log p(targets | inputs)`` ``[B, T]`` under ``model`` at ``temperature`` (the
    loss's own forward)."""
    graphdef, state = nnx.split(model)
    return _logprobs_jit(graphdef, (state,), jnp.asarray(batch["inputs"]),
                         jnp.asarray(batch["targets"]), jnp.asarray(batch["valid"]),
                         float(temperature))


# ----------------------------------------------------------------------------- hooks


@dataclasses.dataclass(frozen=True)
class SuccessScaling:
    """A success-adaptive hook: per-task success rates -> per-task multipliers.

    ``mode="advantage"`` scales a task's advantages by ``w(s)`` and ``mode="kl"`` its KL
    coefficient, where ``s`` is the task's success rate and
    ``w(s) = low + (high - low) / (1 + exp(sharpness * (s - target)))``, a logistic
    that gives tasks below ``target`` success more weight (``high``) and tasks above
    it less (``low``): harder tasks get larger updates (``"advantage"``) or a looser
    leash to the reference (``"kl"`` with ``low > high``, say, keeps solved tasks
    near it). Any callable ``hook(rates: dict[str, float]) -> dict[str, float]``
    with a ``mode`` attribute works in its place.
    """

    mode: str = "advantage"
    target: float = 0.5
    low: float = 0.5
    high: float = 1.5
    sharpness: float = 10.0

    def __post_init__(self):
        if self.mode not in SUCCESS_MODES:
            raise ValueError(f"SuccessScaling.mode={self.mode!r}; expected one of "
                             f"{SUCCESS_MODES}")
        for name in ("target", "low", "high", "sharpness"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"SuccessScaling.{name}={v!r}; expected a number >= 0")

    def __call__(self, rates: Mapping[str, float]) -> dict[str, float]:
        return {task: self.low + (self.high - self.low)
                / (1.0 + math.exp(self.sharpness * (s - self.target)))
                for task, s in rates.items()}


# ----------------------------------------------------------------------------- rollouts


class Rollout(NamedTuple):
    """One sampled batch, scored.

    rows:        the dataset rows, one per completion (a prompt's row repeated G times).
    prompt_ids:  ``[N, P]`` right-padded prompt ids; prompt_lengths ``[N]``.
    completion_ids: ``[N, C]`` generated ids (pad after the stop); completion_lengths ``[N]``.
    texts:       the decoded completions (special tokens dropped).
    scores:      :class:`lab.train.rewards.Scores` (total, per function, no_answer).
    """

    rows: list[dict]
    prompt_ids: np.ndarray
    prompt_lengths: np.ndarray
    completion_ids: np.ndarray
    completion_lengths: np.ndarray
    texts: list[str]
    scores: rewards_lib.Scores


def _rows(dataset, indices) -> list[dict]:
    if hasattr(dataset, "select"):  # datasets.Dataset
        return [dict(r) for r in dataset.select([int(i) for i in indices])]
    return [dict(dataset[int(i)]) for i in indices]


def encode_prompts(tokenizer, prompts: Sequence[str], width: int | None, add_bos: bool = True
                   ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`lab.infer.encode_prompts` with the RL learner's setting named in its error."""
    return infer.encode_prompts(tokenizer, prompts, width, add_bos,
                                 name="RLConfig.max_prompt_len")


def rollout(model, tokenizer, rows: Sequence[Mapping], config: RLConfig, *, seed: int = 0,
            group_size: int | None = None, greedy: bool = False) -> Rollout:
    """Samples ``group_size`` (default ``config.group_size``) completions for each row's
    ``"prompt"`` and scores them with ``config.rewards``; ``greedy=True`` decodes
    greedily (an evaluation). The other columns of the rows go to the reward functions."""
    g = config.group_size if group_size is None else group_size
    for i, r in enumerate(rows):
        if "prompt" not in r:
            raise ValueError(f"row {i} has no 'prompt' column; its columns are {sorted(r)}")
    rep = [dict(r) for r in rows for _ in range(g)]
    prompts = [r["prompt"] for r in rep]
    ids, lens = encode_prompts(tokenizer, prompts, config.max_prompt_len, config.add_bos)
    sampling = {} if greedy else dict(temperature=float(config.temperature),
                                      top_p=config.top_p, top_k=config.top_k)
    out = infer.generate(model, ids, lengths=lens, max_new_tokens=config.max_new_tokens,
                         stop_tokens=(tokenizer.eos_id,), seed=int(seed),
                         pad_id=tokenizer.pad_id, **sampling)
    comp, clen = (np.asarray(x) for x in jax.device_get((out.tokens, out.lengths)))
    texts = [tokenizer.decode(comp[i, :clen[i]]) for i in range(len(rep))]
    columns = sorted({k for r in rep for k in r if k != "prompt"})
    meta = {k: [r.get(k) for r in rep] for k in columns}
    scores = rewards_lib.score(config.rewards, prompts, texts, meta, config.reward_weights)
    return Rollout(rep, ids, lens, comp, clen, texts, scores)


def training_batch(ro: Rollout, pad_id: int) -> dict[str, np.ndarray]:
    """The loss's arrays from a rollout: row ``b`` is its prompt then its completion,
    left-aligned, ``inputs = seq[:-1]``, ``targets = seq[1:]``, ``mask`` 1 on the targets
    that are completion tokens, ``valid`` True on real input tokens."""
    n, p = ro.prompt_ids.shape
    c = ro.completion_ids.shape[1]
    width = p + c
    col = np.arange(width)[None, :]
    plen, clen = ro.prompt_lengths[:, None], ro.completion_lengths[:, None]
    in_prompt = col < plen
    k = np.clip(col - plen, 0, c - 1)
    seq = np.where(in_prompt, np.take_along_axis(ro.prompt_ids, np.minimum(col, p - 1), 1),
                   np.take_along_axis(ro.completion_ids, k, 1))
    real = col < plen + clen
    seq = np.where(real, seq, pad_id).astype(np.int32)
    t = col[:, :-1]
    mask = ((t >= plen - 1) & (t < plen - 1 + clen)).astype(np.float32)
    return {"inputs": seq[:, :-1], "targets": seq[:, 1:], "valid": real[:, :-1],
            "mask": mask}


def group_ids(rows: Sequence[Mapping], group_size: int, group_by: str, scale: str
              ) -> np.ndarray:
    """Dense ``[N]`` group ids: ``"prompt"`` = consecutive blocks of ``group_size``; else
    the value of column ``group_by``. Raises ValueError for a missing column or, with
    ``scale="group"``, a group of fewer than 2 samples (its std is undefined)."""
    n = len(rows)
    if group_by == "prompt":
        ids = np.arange(n) // group_size
    else:
        missing = [i for i, r in enumerate(rows) if group_by not in r]
        if missing:
            raise ValueError(f"RLConfig.group_by={group_by!r}: row {missing[0]} has no such "
                             f"column; its columns are {sorted(rows[missing[0]])}")
        keys = [json.dumps(r[group_by], sort_keys=True, default=str) for r in rows]
        _, ids = np.unique(np.array(keys), return_inverse=True)
    if scale == "group":
        counts = np.bincount(ids)
        if counts.min() < 2:
            g = int(np.argmin(counts))
            first = int(np.flatnonzero(ids == g)[0])
            raise ValueError(f"RLConfig.group_by={group_by!r} with scale_rewards='group': the "
                             f"group of sample {first} has {counts[g]} sample; group "
                             "normalisation needs at least 2 per group (raise group_size, "
                             "group by another column, or use scale_rewards='batch'/'none')")
    return ids.astype(np.int32)


# ----------------------------------------------------------------------------- the loop


class RLTrainer:
    """GRPO-style RL on a Lab Transformer (see the module docstring for one step).

    Args:
      model: a :class:`lab.nn.Transformer` (updated in place by ``fit``).
      tokenizer: Lab's tokenizer interface (``encode``, ``decode``, ``pad_id``, ``eos_id``).
      config: an :class:`RLConfig` or a mapping for ``RLConfig.from_dict``.
      workdir: where ``metrics.jsonl`` and checkpoints go; None keeps it in memory.
      success_hook: None or a callable ``rates -> {task: multiplier}`` with a ``mode``
        attribute in ``("advantage", "kl")`` (e.g. :class:`SuccessScaling`).

    Attributes:
      history: the metric records (as in ``metrics.jsonl``).
      timings: per step ``{"generate", "score", "update"}`` seconds (not in the metrics
        file, which must not depend on the host's speed).
    """

    def __init__(self, model, tokenizer, config: RLConfig | Mapping,
                 workdir: str | None = None, success_hook: Callable | None = None):
        if not isinstance(config, RLConfig):
            config = RLConfig.from_dict(config)
        for name in config.rewards:
            rewards_lib.get(name)  # unknown names fail before any work
        if success_hook is not None:
            if not callable(success_hook) or getattr(success_hook, "mode", None) \
                    not in SUCCESS_MODES:
                raise ValueError(f"success_hook={success_hook!r}; expected a callable with "
                                 f"a mode attribute in {SUCCESS_MODES}")
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.workdir = None if workdir is None else os.path.abspath(workdir)
        self.success_hook = success_hook
        self.history: list[dict] = []
        self.timings: list[dict] = []

    @property
    def metrics_path(self) -> str | None:
        return None if self.workdir is None else os.path.join(self.workdir, "metrics.jsonl")

    def fit(self, dataset, eval_fn: Callable | None = None):
        """Runs (or resumes) RL; returns the model (the same object, trained).

        Args:
          dataset: a ``datasets.Dataset`` or a list of dicts with a ``"prompt"`` column and
            whatever the reward functions read (``exact_match`` reads ``"answer"``);
            ``"task"`` (if present) keys the success rates. Or an online source: a
            callable ``source(step, model) -> rows`` (a list of such dicts) called once per
            step with the current policy, e.g. the states an environment visits under it
            (then ``config.max_prompt_len`` must be set; the rows must be a pure function
            of the step and the model for an exact resume).
          eval_fn: ``eval_fn(model, step) -> dict``, every ``eval_every`` steps and at the
            end, logged with an ``eval/`` prefix.
        """
        cfg = self.config
        if callable(dataset):
            if cfg.max_prompt_len is None:
                raise ValueError("RLConfig.max_prompt_len=None with an online source; "
                                 "expected the prompts' token budget (an int)")
        elif len(dataset) == 0:
            raise ValueError("dataset is empty; expected rows with a 'prompt' column")
        if cfg.max_prompt_len is None:
            n = len(dataset)
            width = max(len(self.tokenizer.encode(r["prompt"], add_bos=cfg.add_bos))
                        for r in _rows(dataset, range(n)))
            cfg = cfg.replace(max_prompt_len=width)
        tcfg = cfg.train_config()
        graphdef, params, rest = nnx.split(self.model, nnx.Param, ...)
        params, rest = jax.tree.map(jnp.copy, (params, rest))
        ref = jax.tree.map(jnp.copy, params) if cfg.uses_reference else None
        opt_state = make_optimizer(tcfg).init(params)
        key = jax.random.key(cfg.seed)
        loss_fn = GRPOLoss(cfg.clip_eps, cfg.clip_eps_high, cfg.kl_estimator, cfg.aggregation,
                           _policy_temperature(cfg))
        step_fn = compiled_step(graphdef, loss_fn, step_config(tcfg), False)
        controller = {"kl_coef": float(cfg.kl_coef), "success": {}}

        start, ckpt, log_file = 0, None, None
        self.history, self.timings = [], []
        try:
            if self.workdir is not None:
                os.makedirs(self.workdir, exist_ok=True)
                ckpt = RunCheckpoints(os.path.join(self.workdir, "checkpoints"),
                                      cfg.keep_checkpoints)
                restored = ckpt.restore_latest(_run_state(params, rest, opt_state, key, ref))
                if restored is not None:
                    start, state, meta = restored
                    params, rest, opt_state = state["params"], state["rest"], state["opt_state"]
                    key, ref = state["rng"], state.get("ref")
                    controller = meta["controller"]
                    logging.info("Resuming RL from checkpoint step %d in %s", start,
                                 self.workdir)
                self.history = truncate_metrics(self.metrics_path, start)
                log_file = open(self.metrics_path, "a")  # noqa: SIM115 - closed in finally

            bar = tqdm(total=cfg.steps, initial=min(start, cfg.steps), disable=not cfg.progress,
                       desc="rl", dynamic_ncols=True)
            for s in range(start, cfg.steps):
                model = nnx.merge(graphdef, params, rest)
                params, rest, opt_state, record = self._step(
                    s, cfg, dataset, model, graphdef, params, rest, opt_state, key, ref,
                    step_fn, controller)
                done, final = s + 1, s + 1 == cfg.steps
                if not due(done, cfg.log_every, final):
                    record = {}
                record = log_update(
                    done, record, eval_fn=eval_fn, eval_due=bool(cfg.eval_every)
                    and due(done, cfg.eval_every, final),
                    model_fn=lambda: nnx.merge(graphdef, params, rest),  # noqa: B023
                    history=self.history, log_file=log_file)
                if "reward" in record:
                    bar.set_postfix(reward=f"{record['reward']:.3f}", kl=f"{record['kl']:.3g}",
                                    refresh=False)
                if ckpt is not None and due(done, cfg.checkpoint_every, final):
                    os.fsync(log_file.fileno())
                    ckpt.save(done, _run_state(params, rest, opt_state, key, ref),
                              {"config": cfg.to_dict(), "controller": controller})
                bar.update(1)
            bar.close()
        finally:
            if log_file is not None:
                log_file.close()
            if ckpt is not None:
                ckpt.close()
        nnx.update(self.model, params, rest)
        return self.model

    def _step(self, s, cfg, dataset, model, graphdef, params, rest, opt_state, key, ref,
              step_fn, controller):
        """One RL step; returns the new states and the step's metric record."""
        t0 = time.perf_counter()
        if callable(dataset):
            rows = list(dataset(s, model))
            if not rows:
                raise ValueError(f"the online source returned no rows at step {s}; expected "
                                 "at least one dict with a 'prompt'")
        else:
            rows = _rows(dataset, step_indices(len(dataset), cfg.prompts_per_step, s,
                                               cfg.seed))
        ro = rollout(model, self.tokenizer, rows, cfg, seed=_seed(cfg.seed, s))
        t1 = time.perf_counter()
        rewards = ro.scores.total
        gids = group_ids(ro.rows, cfg.group_size, cfg.group_by, cfg.scale_rewards)
        tasks = [str(r.get("task", "all")) for r in ro.rows]
        rates = _update_success(controller, tasks, rewards >= cfg.success_threshold,
                                cfg.success_ema)
        adv_scale = np.ones(len(rows) * cfg.group_size, np.float32)
        kl_scale = np.ones_like(adv_scale)
        if self.success_hook is not None:
            mult = self.success_hook(rates)
            per = np.array([float(mult.get(t, 1.0)) for t in tasks], np.float32)
            if not np.all(np.isfinite(per)) or np.any(per < 0):
                raise ValueError(f"success_hook returned {mult}; expected finite multipliers "
                                 ">= 0")
            if self.success_hook.mode == "advantage":
                adv_scale = per
            else:
                kl_scale = per
        adv = np.asarray(grpo_advantages(jnp.asarray(rewards), jnp.asarray(gids),
                                         scale=cfg.scale_rewards, eps=cfg.adv_eps)) * adv_scale
        batch = training_batch(ro, self.tokenizer.pad_id)
        batch["advantages"] = adv.astype(np.float32)
        batch["kl_coef"] = (controller["kl_coef"] * kl_scale).astype(np.float32)
        if ref is not None:
            batch["ref_logp"] = np.asarray(_logprobs_jit(
                graphdef, (ref, rest), batch["inputs"], batch["targets"], batch["valid"],
                _policy_temperature(cfg)))
        if cfg.epochs * cfg.minibatches > 1:
            batch["old_logp"] = np.asarray(sequence_logprobs(model, batch,
                                                             _policy_temperature(cfg)))
        t2 = time.perf_counter()
        size = batch["inputs"].shape[0] // cfg.minibatches
        metrics = []
        for e in range(cfg.epochs):
            order = (np.arange(len(adv)) if cfg.minibatches == 1
                     else np.random.default_rng([cfg.seed, s, e]).permutation(len(adv)))
            for m in range(cfg.minibatches):
                sel = order[m * size:(m + 1) * size]
                mb = {k: jnp.asarray(v[sel]) for k, v in batch.items()}
                u = (s * cfg.epochs + e) * cfg.minibatches + m
                params, rest, opt_state, out = step_fn(params, rest, opt_state, mb,
                                                       jnp.int32(u), key)
                metrics.append(out)
        metrics = jax.device_get(metrics)
        t3 = time.perf_counter()
        self.timings.append({"generate": t1 - t0, "score": t2 - t1, "update": t3 - t2})
        mean = {k: float(np.mean([m[k] for m in metrics])) for k in metrics[0]}
        if cfg.kl_target is not None:
            controller["kl_coef"] = adaptive_kl(controller["kl_coef"], mean["kl"],
                                                cfg.kl_target, cfg.kl_horizon)
        record = {
            "reward": float(np.mean(rewards)), "reward_std": float(np.std(rewards)),
            **{f"reward/{k}": float(np.mean(v)) for k, v in ro.scores.per_fn.items()},
            "success": float(np.mean(rewards >= cfg.success_threshold)),
            **{f"success/{t}": v for t, v in sorted(rates.items())},
            "no_answer": float(np.mean(ro.scores.no_answer)),
            "no_answer_count": int(np.sum(ro.scores.no_answer)),
            "completion_length": float(np.mean(ro.completion_lengths)),
            "truncated": float(np.mean((ro.completion_lengths == cfg.max_new_tokens)
                                       & (ro.completion_ids[:, -1] != self.tokenizer.eos_id))),
            "frac_zero_std_groups": _zero_std_fraction(rewards, gids),
            "kl": mean["kl"], "kl_coef": float(np.mean(batch["kl_coef"])),
            "clip_frac": mean["clip_frac"], "clip_low": mean["clip_low"],
            "clip_high": mean["clip_high"], "ratio": mean["ratio"], "loss": mean["loss"],
            "pg_loss": mean["pg_loss"], "grad_norm": mean["grad_norm"], "lr": mean["lr"],
        }
        return params, rest, opt_state, record


def _policy_temperature(cfg: RLConfig) -> float:
    """The temperature the policy's log-probabilities are taken at: the sampling one
    (greedy sampling, temperature 0, trains the untempered model)."""
    return float(cfg.temperature) if cfg.temperature > 0 else 1.0


def _run_state(params, rest, opt_state, key, ref) -> dict:
    """What a checkpoint holds (the reference only when the run has one)."""
    state = {"params": params, "rest": rest, "opt_state": opt_state, "rng": key}
    if ref is not None:
        state["ref"] = ref
    return state


def _seed(seed: int, step: int) -> int:
    """The sampling seed of RL step ``step`` (an int for :func:`lab.infer.generate`)."""
    return int(np.random.default_rng([seed, step, 7]).integers(0, 2**31 - 1))


def _update_success(controller: dict, tasks: list[str], success: np.ndarray,
                    ema: float) -> dict[str, float]:
    rates = controller["success"]
    for t in sorted(set(tasks)):
        now = float(np.mean(success[np.array(tasks) == t]))
        rates[t] = now if t not in rates else ema * rates[t] + (1.0 - ema) * now
    return dict(rates)


def _zero_std_fraction(rewards: np.ndarray, gids: np.ndarray) -> float:
    """The fraction of groups whose rewards are all equal (no learning signal)."""
    groups = np.unique(gids)
    flat = [np.ptp(rewards[gids == g]) == 0 for g in groups]
    return float(np.mean(flat))


def evaluate(model, tokenizer, rows: Sequence[Mapping], config: RLConfig,
             batch_size: int = 64) -> dict[str, float]:
    """Greedy held-out evaluation: ``{"reward", "no_answer", "reward/<fn>"...}`` means
    over ``rows`` (one greedy completion each), in chunks of ``batch_size`` rows
    (the last chunk padded by repeating rows, which are not counted)."""
    rows = list(rows)
    if config.max_prompt_len is None:
        width = max(len(tokenizer.encode(r["prompt"], add_bos=config.add_bos)) for r in rows)
        config = config.replace(max_prompt_len=width)
    totals, per_fn, no_answer = [], {}, []
    for i in range(0, len(rows), batch_size):
        chunk = rows[i:i + batch_size]
        m = len(chunk)
        chunk = chunk + [chunk[-1]] * (batch_size - m)
        ro = rollout(model, tokenizer, chunk, config, group_size=1, greedy=True)
        totals.append(ro.scores.total[:m])
        no_answer.append(ro.scores.no_answer[:m])
        for k, v in ro.scores.per_fn.items():
            per_fn.setdefault(k, []).append(v[:m])
    out = {"reward": float(np.mean(np.concatenate(totals))),
           "no_answer": float(np.mean(np.concatenate(no_answer)))}
    out.update({f"reward/{k}": float(np.mean(np.concatenate(v))) for k, v in per_fn.items()})
    return out
