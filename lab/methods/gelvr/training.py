"""GeLVR's SFT and GePO's RL of a zoo VLM on fine-grained perception, with the baselines.

The task is :func:`lab.data.image_qa` ("What colour is the triangle?", "What is the red
object?" among lures) at two resolutions: the full image, and the same image box-filtered
down by ``low_factor`` and repeated back (:func:`lab.methods.gelvr.latent.low_resolution`:
the same token grid, less detail). Every variant fine-tunes the same zoo model on the
same rows, half of each batch at each resolution, with :func:`lab.train.make_optimizer`'s
AdamW (clip 1, warm-up then cosine); they differ in what stands between the image and ``<answer>``
(:func:`lab.methods.gelvr.latent.run_steps`):

* ``direct``: nothing (the option cross-entropy alone);
* ``text``: a chain of thought in words, the target's colour and kind ("red triangle"),
  teacher-forced in training (its cross-entropy weighted ``cot_weight``) and decoded
  greedily at evaluation;
* ``latent``: ``num_steps`` latent slots fed back from the decoder's state, trained by the
  answer's cross-entropy through every step, plus ``geometry_coef`` times GeLVR's Gram
  alignment of the slots with the zoomed target's visual features
  (:func:`lab.methods.gelvr.gram_alignment_loss`, :func:`~lab.methods.gelvr.latent.
  zoom_features`); ``geometry_coef = 0`` is "latent slots without the geometry loss";
  ``slot_coef`` adds :func:`lab.methods.gelvr.slot_alignment_loss` (each slot towards
  its own target feature, the slots supervised in isolation) to either.

GePO (:func:`train_gepo`) continues from a latent model: groups of ``group`` rollouts per
prompt (slots sampled from the vMF policy, or the Gaussian baseline with the same mean
cosine, the answer sampled from the option posterior), reward 1 for the right option,
GRPO's group advantages (:func:`lab.train.rl.grpo_advantages`), one on-policy update per
batch of :class:`lab.methods.gelvr.GePOLoss` (the shared policy-gradient loss plus
``geometry_coef`` times the Gram term; 0 is "RL without the regulariser").
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from lab.data import image_qa, render_images
from lab.data.synthetic.render import BACKGROUND, COLOUR_NAMES, kind_name, object_box
from lab.methods.gelvr import latent
from lab.methods.gelvr.losses import GePOLoss, gram_alignment_loss, slot_alignment_loss
from lab.train.config import TrainConfig, make_optimizer
from lab.train.rl import grpo_advantages
from lab.zoo import vlm as zvlm

RESOLUTIONS = ("high", "low")


class PerceptionData(NamedTuple):
    """Rows of the task with everything the variants read.

    questions / options: lists; answer ``[N]``; high / low ``uint8 [N, H, W, 3]`` (the
    image at full and at low resolution, same size); target ``[N, 8, D]`` (or None) the
    slots' target, :func:`lab.methods.gelvr.latent.zoom_features` of the base model: for a
    one-hop question the answer's object, each of its 4 tokens twice; for ``match`` the
    named object's 4 tokens, then the answer object's (the order a chain visits them);
    cot ``[N, 2]`` the chain's word ids (the target's colour and kind); question_type
    ``[N]``; objects (each row's objects, the target last).
    """

    questions: list
    options: list
    answer: np.ndarray
    high: np.ndarray
    low: np.ndarray
    target: np.ndarray
    cot: np.ndarray
    question_type: np.ndarray
    objects: list


def perception_data(base, n: int, seed: int, *, size: int, low_factor: int,
                    object_size, distractors, question_types, targets: bool = True
                    ) -> PerceptionData:
    """``n`` image_qa rows at ``size`` pixels with their low-resolution copies, geometry
    targets from ``base`` (a frozen :class:`lab.nn.VLM`; None unless ``targets``, which
    evaluation does not read) and chains."""
    if size % low_factor:
        raise ValueError(f"low_factor={low_factor} must divide size={size}")
    ds = image_qa(n, seed, size=size, low_size=size // low_factor, object_size=object_size,
                  distractors=distractors, question_types=question_types)
    high = render_images(ds)
    if targets:
        # one hop: the answer's object, each token twice (pooled to 4 slots, its 4 tokens);
        # match: the named object's 4 tokens, then the answer's (2 slots each)
        answer = latent.zoom_features(base, high, ds["target_box"])
        target = np.repeat(answer, 2, axis=1)
        hops = np.flatnonzero(np.asarray(ds["question_type"]) == "match")
        if len(hops):
            objects = ds["objects"]
            named = latent.zoom_features(base, high[hops],
                                         [object_box(objects[i][-2]) for i in hops])
            target[hops] = np.concatenate([named, answer[hops]], 1)
    tok = zvlm.TOKENIZER
    cot = np.array([tok.encode(f"{COLOUR_NAMES[r[-1]['colour']]} {kind_name(r[-1]['kind'])}")
                    for r in ds["objects"]], np.int32)
    return PerceptionData(list(ds["question"]), list(ds["options"]),
                          np.asarray(ds["answer_index"], np.int32), high,
                          latent.low_resolution(high, low_factor),
                          target if targets else None, cot,
                          np.asarray(ds["question_type"]), list(ds["objects"]))


def _inputs(model, data: PerceptionData, idx, low) -> tuple[zvlm.Batch, dict]:
    """The encoded batch of rows ``idx``, each at low resolution where ``low``."""
    images = np.where(np.asarray(low)[:, None, None, None], data.low[idx], data.high[idx])
    b = zvlm.encode(model.config, images[:, None], [data.questions[i] for i in idx],
                    [data.options[i] for i in idx])
    return b, latent.arrays(b)


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """One supervised variant: ``mode`` (:data:`lab.methods.gelvr.latent.MODES`),
    ``num_steps`` (latent slots; the text chain has 2 words), the loss weights and the
    optimisation."""

    mode: str = "latent"
    num_steps: int = 4
    geometry_coef: float = 0.0
    slot_coef: float = 0.0
    cot_weight: float = 1.0
    steps: int = 300
    batch: int = 32
    learning_rate: float = 1e-3

    def __post_init__(self):
        if self.mode not in latent.MODES:
            raise ValueError(f"SFTConfig.mode={self.mode!r}; expected one of {latent.MODES}")
        if self.mode == "latent" and self.num_steps < 2 and self.geometry_coef:
            raise ValueError(f"SFTConfig.num_steps={self.num_steps}: the geometry loss "
                             "needs >= 2 slots")
        if min(self.geometry_coef, self.slot_coef, self.cot_weight) < 0:
            raise ValueError(f"SFTConfig: geometry_coef={self.geometry_coef}, slot_coef="
                             f"{self.slot_coef} and cot_weight={self.cot_weight} must be "
                             ">= 0")

    @property
    def steps_between(self) -> int:
        """Reasoning steps between the image and ``<answer>``."""
        return {"direct": 0, "text": 2, "latent": self.num_steps}[self.mode]


@functools.lru_cache(maxsize=32)
def _transform(config: TrainConfig) -> optax.GradientTransformation:
    """:func:`lab.train.make_optimizer` of ``config``, one object per config, so that every
    variant's optimizer has the same graph and the train steps compile once."""
    return make_optimizer(config)


def _optimizer(model, learning_rate: float, steps: int):
    """AdamW (weight decay 0.01 on matrices), clip 1, warm-up then cosine to 0."""
    config = TrainConfig(steps=int(steps), learning_rate=float(learning_rate),
                         warmup_steps=min(50, int(steps) // 10), weight_decay=0.01)
    return nnx.Optimizer(model, _transform(config), wrt=nnx.Param)


def _sft_loss(model, x, answer, target, cot, coefs, *, grid, mode, num_steps):
    lm = model.language_model
    choose = latent.teacher(lm, cot) if mode == "text" else None
    st = latent.run_steps(model, x, grid, num_steps, choose)
    nll = optax.softmax_cross_entropy_with_integer_labels(st.scores, answer).mean()
    loss, geo, slot = nll, jnp.zeros(()), jnp.zeros(())
    if mode == "latent" and num_steps >= 1:
        slot = slot_alignment_loss(st.inputs, target)
        loss = loss + coefs[2] * slot
    if mode == "latent" and num_steps >= 2:
        geo = gram_alignment_loss(st.inputs, target)
        loss = loss + coefs[0] * geo
    if mode == "text":
        loss = loss + coefs[1] * optax.softmax_cross_entropy_with_integer_labels(
            st.logits, cot).mean()
    acc = (jnp.argmax(st.scores, -1) == answer).mean()
    return loss, {"nll": nll, "geometry": geo, "slot": slot, "acc": acc}


@nnx.jit(static_argnames=("grid", "mode", "num_steps"))
def _sft_step(model, opt, x, answer, target, cot, coefs, *, grid, mode, num_steps):
    (loss, m), grads = nnx.value_and_grad(
        lambda mm: _sft_loss(mm, x, answer, target, cot, coefs, grid=grid, mode=mode,
                             num_steps=num_steps), has_aux=True)(model)
    opt.update(model, grads)
    return dict(m, loss=loss)


def train_sft(model, data: PerceptionData, cfg: SFTConfig, *, seed: int, log=None
              ) -> list[dict]:
    """Fine-tunes ``model`` in place on ``data`` (random rows, half of each batch at low
    resolution); returns the curve (every 25 steps: loss, answer nll, Gram loss, per-slot
    loss, accuracy on the batch)."""
    opt = _optimizer(model, cfg.learning_rate, cfg.steps)
    rng = np.random.default_rng([seed, 31])
    coefs = jnp.asarray([cfg.geometry_coef, cfg.cot_weight, cfg.slot_coef], jnp.float32)
    curve = []
    for i in range(cfg.steps):
        idx = rng.integers(0, len(data.answer), cfg.batch)
        b, x = _inputs(model, data, idx, np.arange(cfg.batch) % 2 == 1)
        m = _sft_step(model, opt, x, jnp.asarray(data.answer[idx]),
                      jnp.asarray(data.target[idx]), jnp.asarray(data.cot[idx]), coefs,
                      grid=b.grid, mode=cfg.mode, num_steps=cfg.steps_between)
        if i % 25 == 0 or i == cfg.steps - 1:
            row = {"step": i, **{k: round(float(v), 4) for k, v in m.items()}}
            curve.append(row)
            if log:
                log(row)
    return curve


@nnx.jit(static_argnames=("grid", "num_steps", "mode"))
def _eval_scores(model, x, *, grid, num_steps, mode):
    choose = latent.greedy(model.language_model) if mode == "text" else None
    st = latent.run_steps(model, x, grid, num_steps, choose)
    return st.scores


def evaluate(model, data: PerceptionData, cfg: SFTConfig, resolution: str, *,
             batch_size: int = 64) -> np.ndarray:
    """Per-row correctness ``[N]`` (bool) of the deterministic policy (latent slots fed
    their means, the chain decoded greedily) at ``resolution`` (``"high"`` / ``"low"``)."""
    if resolution not in RESOLUTIONS:
        raise ValueError(f"resolution={resolution!r}; expected one of {RESOLUTIONS}")
    n = len(data.answer)
    right = []
    for lo in range(0, n, batch_size):
        idx = np.arange(lo, min(lo + batch_size, n))
        pad = np.concatenate([idx, np.full(batch_size - len(idx), idx[0])])
        b, x = _inputs(model, data, pad, np.full(batch_size, resolution == "low"))
        s = _eval_scores(model, x, grid=b.grid, num_steps=cfg.steps_between, mode=cfg.mode)
        right.append(np.asarray(jnp.argmax(s, -1))[:len(idx)] == data.answer[idx])
    return np.concatenate(right)


def blank_images(data: PerceptionData) -> PerceptionData:
    """``data`` with every image, at both resolutions, the empty canvas: the question alone
    (fine-tuning on it gives the question-only baseline)."""
    blank = np.broadcast_to(BACKGROUND, data.high.shape).astype(np.uint8)
    return data._replace(high=blank, low=blank)


def question_only(model, data: PerceptionData, *, batch_size: int = 64) -> np.ndarray:
    """Per-row correctness of ``model`` with a blank image (the question alone)."""
    return evaluate(model, blank_images(data), SFTConfig(mode="direct"), "high",
                    batch_size=batch_size)


@dataclasses.dataclass(frozen=True)
class GePOConfig:
    """GePO (``family="vmf"``) or the Gaussian-policy baseline; ``geometry_coef=0`` drops
    the regulariser. ``kappa``: the vMF concentration (the Gaussian's sigma matches its
    mean cosine, :func:`lab.methods.gelvr.latent.gaussian_scale`)."""

    family: str = "vmf"
    geometry_coef: float = 1.0
    kappa: float = 200.0
    num_steps: int = 4
    steps: int = 100
    prompts: int = 8
    group: int = 4
    learning_rate: float = 3e-4

    def __post_init__(self):
        if self.family not in ("vmf", "gaussian"):
            raise ValueError(f"GePOConfig.family={self.family!r}; expected 'vmf' or 'gaussian'")
        if not self.kappa > 0:
            raise ValueError(f"GePOConfig.kappa={self.kappa}; expected > 0")
        if self.group < 2:
            raise ValueError(f"GePOConfig.group={self.group}; group advantages need >= 2")


def _policy_forward(model, batch, *, grid, family, kappa):
    return latent.policy_output(model, batch["x"], grid, batch["latents"][:, :-1],
                                family=family, kappa=kappa)


@nnx.jit(static_argnames=("grid", "family", "kappa"))
def _gepo_step(model, opt, batch, geometry_coef, *, grid, family, kappa):
    # GePOLoss at coefficient 0 still measures the Gram term (the batch has its target);
    # the coefficient is added here as a traced number, so with and without the
    # regulariser share one compiled step.
    loss_fn = GePOLoss(functools.partial(_policy_forward, grid=grid, family=family,
                                         kappa=kappa), family=family, geometry_coef=0.0)

    def total(mm):
        loss, m = loss_fn(mm, batch)
        return loss + geometry_coef * m["geometry"], m

    (loss, m), grads = nnx.value_and_grad(total, has_aux=True)(model)
    opt.update(model, grads)
    return {"loss": loss, "geometry": m["geometry"]}


def train_gepo(model, data: PerceptionData, cfg: GePOConfig, *, seed: int, log=None
               ) -> list[dict]:
    """RL of a latent-slot ``model`` in place (see the module docstring); returns the curve
    (every 10 steps: mean reward of the batch's rollouts, loss, Gram loss)."""
    opt = _optimizer(model, cfg.learning_rate, cfg.steps)
    rng = np.random.default_rng([seed, 41])
    key = jax.random.key(seed)
    s = cfg.num_steps
    n = cfg.prompts * cfg.group
    gids = jnp.repeat(jnp.arange(cfg.prompts), cfg.group)
    is_latent = jnp.broadcast_to(jnp.arange(s + 1) < s, (n, s + 1))
    coef = jnp.asarray(cfg.geometry_coef, jnp.float32)
    curve = []
    for i in range(cfg.steps):
        rows = rng.integers(0, len(data.answer), cfg.prompts)
        idx = np.repeat(rows, cfg.group)
        b, x = _inputs(model, data, idx, np.repeat(np.arange(cfg.prompts) % 2 == 1, cfg.group))
        ro = latent.sample_rollout(model, x, jax.random.fold_in(key, i), grid=b.grid,
                                   num_steps=s, family=cfg.family, kappa=cfg.kappa)
        reward = (np.asarray(ro.answer) == data.answer[idx]).astype(np.float32)
        d = ro.actions.shape[-1]
        batch = {"x": x,
                 "targets": jnp.concatenate([jnp.zeros((n, s), jnp.int32),
                                             ro.answer[:, None].astype(jnp.int32)], 1),
                 "latents": jnp.concatenate([ro.actions, jnp.zeros((n, 1, d))], 1),
                 "is_latent": is_latent,
                 "slot_positions": jnp.broadcast_to(jnp.arange(s), (n, s)),
                 "mask": jnp.ones((n, s + 1), jnp.float32),
                 "advantages": grpo_advantages(jnp.asarray(reward), gids),
                 "geometry_target": jnp.asarray(data.target[idx])}
        m = _gepo_step(model, opt, batch, coef, grid=b.grid, family=cfg.family,
                       kappa=float(cfg.kappa))
        if i % 10 == 0 or i == cfg.steps - 1:
            row = {"step": i, "reward": round(float(reward.mean()), 4),
                   **{k: round(float(v), 4) for k, v in m.items()}}
            curve.append(row)
            if log:
                log(row)
    return curve
