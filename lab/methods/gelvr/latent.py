"""Reasoning steps between the image and the answer of a zoo VLM: latent slots (GeLVR,
GePO), a text chain of thought, or none.

A zoo prompt (:func:`lab.zoo.vlm.encode`, the scored format) is ``<bos> question
<vision_start> visual tokens <vision_end> <answer>`` and each option is scored by its
words after it. :func:`run_steps` puts ``S`` steps between ``<vision_end>`` and
``<answer>``: step ``j``'s input embedding is chosen from the decoder's state at the
position before it,

* ``latent``: the final-normed last hidden state ``m_j`` itself (Coconut's feedback,
  Hao et al. 2024, "Training Large Language Models to Reason in a Continuous Latent
  Space") when deterministic; GePO's policy samples a direction ``z_j ~ vMF(m_j / |m_j|,
  kappa)`` and feeds ``|m_j| z_j`` (the sampled slot keeps the state's norm), the
  Gaussian baseline ``z_j ~ N(m_j, sigma_j^2 I)`` and feeds ``z_j``;
* ``text``: the embedding of a word: the given chain (teacher forcing) or the argmax of
  the step's logits (greedy decoding), a chain of thought in words;

then scores the options after ``<answer>`` (:func:`lab.zoo.vlm.score_options`). Steps are
text tokens to M-RoPE (all three rows advance by one). Every step re-runs the prefix
(``S + 1`` forwards of a few dozen tokens): the reference computation, fast enough at the
zoo's sizes, with gradients through every step as Coconut trains.

GeLVR's geometry target (:func:`zoom_features`): the frozen model's merged visual tokens
of a zoomed crop centred on the asked-about object at full resolution, the centre
``2 x 2`` of them, which is the object at twice its size. The slots' cosine Gram matrix
is aligned with theirs (:func:`lab.methods.gelvr.gram_alignment_loss`): the target is
privileged (it needs the object's box and the full-resolution image), the input may be
the low-resolution image.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab.methods.gelvr.policy import FAMILIES, HybridPolicyOutput, mean_direction
from lab.methods.gelvr.vmf import mean_resultant_length, vmf_sample
from lab.zoo import vlm as zvlm

MODES = ("direct", "text", "latent")


class Steps(NamedTuple):
    """What :func:`run_steps` returns.

    scores: ``[B, K]`` options' log-probabilities (summed over their words) after the steps.
    means:  ``[B, S, D]`` the decoder's final-normed last hidden state before each step.
    logits: ``[B, S, V]`` the word logits there.
    inputs: ``[B, S, D]`` the embeddings fed at the steps.
    """

    scores: jax.Array
    means: jax.Array
    logits: jax.Array
    inputs: jax.Array


def arrays(batch: zvlm.Batch) -> dict:
    """A :class:`lab.zoo.vlm.Batch` as the dict of arrays :func:`run_steps` takes (its
    static ``grid`` apart)."""
    return {k: jnp.asarray(getattr(batch, k)) for k in
            ("ids", "valid", "pixels", "rope", "nxt", "options", "opt_valid")}


def run_steps(model, x: dict, grid: tuple, num_steps: int,
              choose: Callable[[int, jax.Array, jax.Array], jax.Array] | None = None) -> Steps:
    """The options' scores after ``num_steps`` reasoning steps (see the module docstring).

    ``x``: :func:`arrays` of a zoo batch (prompts ending with ``<answer>``); ``grid`` its
    static grid. ``choose(j, mean [B, D], logits [B, V]) -> [B, D]`` gives step ``j``'s
    input embedding (default: ``mean``, the deterministic latent slot). ``num_steps=0``
    is the model's plain scoring (:func:`lab.zoo.vlm.option_posteriors`'s logits).
    Traceable (call it under ``jax.jit`` / ``nnx.jit`` for speed).
    """
    choose = choose or (lambda j, mean, logits: mean)
    lm = model.language_model
    e = model.embed(x["ids"], pixel_values_videos=x["pixels"], video_grid_thw=np.array(grid),
                    rope_positions=(x["rope"], x["nxt"]))
    prefix, answer = e.inputs_embeds[:, :-1], e.inputs_embeds[:, -1:]
    pos, rope, valid = e.positions[:, :-1], e.rope_positions[:, :, :-1], x["valid"][:, :-1]
    b, d = prefix.shape[0], prefix.shape[-1]
    start = e.positions[:, -1]                         # where <answer> was: the first step
    fed, means, logits = [], [], []

    def layout(n):                                     # the prefix and n steps after it
        step_pos = start[:, None] + jnp.arange(n, dtype=jnp.int32)[None]
        return (jnp.concatenate([pos, step_pos], 1),
                jnp.concatenate([rope, jnp.broadcast_to(step_pos, (3, b, n))], 2),
                jnp.concatenate([valid, jnp.ones((b, n), bool)], 1))

    for j in range(num_steps):
        p, r, v = layout(j)
        seq = jnp.concatenate([prefix, *(f[:, None] for f in fed)], axis=1)
        out, inter = lm(inputs_embeds=seq, positions=p, rope_positions=r, mask=v,
                        capture=("hidden",))
        mean = lm.norm(inter.hidden[-1][:, -1]).astype(jnp.float32)
        means.append(mean)
        logits.append(out[:, -1])
        fed.append(choose(j, mean, out[:, -1]).astype(prefix.dtype))
    p, r, v = layout(num_steps)
    answer_pos = start + num_steps
    seq = jnp.concatenate([prefix, *(f[:, None] for f in fed), answer], axis=1)
    scores, _ = zvlm.score_options(
        lm, seq, jnp.concatenate([p, answer_pos[:, None]], 1),
        jnp.concatenate([r, jnp.broadcast_to(answer_pos[None, :, None], (3, b, 1))], 2),
        jnp.concatenate([v, x["valid"][:, -1:]], 1), answer_pos + 1, x["options"],
        x["opt_valid"])

    def stack(xs, shape):
        return jnp.stack(xs, 1) if xs else jnp.zeros(shape, jnp.float32)

    return Steps(scores, stack(means, (b, 0, d)),
                 stack(logits, (b, 0, lm.config.vocab_size)), stack(fed, (b, 0, d)))


def teacher(lm, words: jax.Array) -> Callable:
    """``choose`` feeding the embedding of ``words [B, S]`` (a text chain, teacher forced)."""
    return lambda j, mean, logits: lm.embed(words[:, j])


def greedy(lm) -> Callable:
    """``choose`` feeding the embedding of each step's argmax word (greedy decoding)."""
    return lambda j, mean, logits: lm.embed(jnp.argmax(logits, -1))


@functools.lru_cache(maxsize=64)
def gaussian_scale(d: int, kappa: float) -> float:
    """The Gaussian policy's ``sigma / |m|`` whose samples ``m + sigma eps`` have the
    mean cosine to ``m`` of vMF samples of concentration ``kappa`` on S^{d-1} (``1 /
    sqrt(1 + c^2 d) = A_d(kappa)``), so that the two policies explore equally far."""
    with jax.ensure_compile_time_eval():
        a = float(mean_resultant_length(d, float(kappa)))
    return math.sqrt(1.0 / a**2 - 1.0) / math.sqrt(d)


def latent_param(family: str, mean: jax.Array, kappa: float) -> jax.Array:
    """The policy's concentration at a step: ``kappa`` (vMF) or ``sigma = |m| c`` (Gaussian,
    :func:`gaussian_scale`, the norm held fixed under the gradient) ``[B]``."""
    if family == "vmf":
        return jnp.full(mean.shape[:-1], kappa, jnp.float32)
    norm = jax.lax.stop_gradient(jnp.linalg.norm(mean, axis=-1))
    return norm * gaussian_scale(mean.shape[-1], kappa)


def embed_action(family: str, mean: jax.Array, action: jax.Array) -> jax.Array:
    """The input embedding of a latent action: ``|m| z`` for a vMF direction ``z``, the
    Gaussian sample itself."""
    if family == "vmf":
        return action * jnp.linalg.norm(mean, axis=-1, keepdims=True)
    return action


def sampler(key: jax.Array, family: str, kappa: float, record: list) -> Callable:
    """``choose`` sampling each latent step from the policy (appending the action to
    ``record``)."""
    if family not in FAMILIES:
        raise ValueError(f"family={family!r}; expected one of {FAMILIES}")

    def choose(j, mean, logits):
        k = jax.random.fold_in(key, j)
        m = jax.lax.stop_gradient(mean)
        param = latent_param(family, m, kappa)
        if family == "vmf":
            z = vmf_sample(k, mean_direction(m), param)
        else:
            z = m + param[:, None] * jax.random.normal(k, m.shape, jnp.float32)
        record.append(z)
        return embed_action(family, mean, z)

    return choose


def replay(family: str, actions: jax.Array) -> Callable:
    """``choose`` feeding recorded latent actions ``[B, S, d]`` (the loss's recomputation)."""
    return lambda j, mean, logits: embed_action(family, mean, actions[:, j])


class Rollout(NamedTuple):
    """One sampled trajectory per row: latent ``actions [B, S, D]``, the sampled option
    ``answer [B]`` and its log-probability under the option posterior ``answer_logp``."""

    actions: jax.Array
    answer: jax.Array
    answer_logp: jax.Array


@functools.partial(nnx.jit, static_argnames=("grid", "num_steps", "family", "kappa"))
def sample_rollout(model, x: dict, key: jax.Array, *, grid: tuple, num_steps: int,
                   family: str, kappa: float) -> Rollout:
    """Samples the latent steps from the hybrid policy and the answer from the option
    posterior after them."""
    record: list = []
    k_lat, k_ans = jax.random.split(key)
    st = run_steps(model, x, grid, num_steps, sampler(k_lat, family, kappa, record))
    logp = jax.nn.log_softmax(st.scores, -1)
    ans = jax.random.categorical(k_ans, logp)
    return Rollout(jnp.stack(record, 1), ans,
                   jnp.take_along_axis(logp, ans[:, None], 1)[:, 0])


def policy_output(model, x: dict, grid: tuple, actions: jax.Array, *, family: str,
                  kappa: float) -> HybridPolicyOutput:
    """The hybrid policy along recorded trajectories, ``S`` latent steps then the answer
    step, ``[B, S + 1, ...]``: logits over the options at the answer step, the latent
    means and concentrations at the latent steps, zero elsewhere (:func:`lab.methods.gelvr.
    hybrid_log_prob` reads each step's own family only)."""
    num_steps = actions.shape[1]
    st = run_steps(model, x, grid, num_steps, replay(family, actions))
    b, k = st.scores.shape
    logits = jnp.concatenate([jnp.zeros((b, num_steps, k), jnp.float32),
                              st.scores[:, None]], 1)
    d = st.means.shape[-1]
    means = jnp.concatenate([st.means, jnp.zeros((b, 1, d), jnp.float32)], 1)
    param = jnp.concatenate([jax.vmap(lambda m: latent_param(family, m, kappa), 1, 1)(st.means),
                             jnp.zeros((b, 1), jnp.float32)], 1)
    return HybridPolicyOutput(logits, means, param)


def zoom(images: np.ndarray, boxes, side: int) -> np.ndarray:
    """``uint8 [B, H, W, 3]`` crops of ``side`` pixels centred on each ``box`` (``[x, y, w,
    h]``), moved inside the image, resized to ``H x W`` by pixel repetition (``side`` must
    divide ``H = W``)."""
    images = np.asarray(images)
    b, h, w = images.shape[:3]
    if h != w or side < 1 or h % side:
        raise ValueError(f"zoom side={side} must divide the image side; images are {h}x{w}")
    out = np.empty_like(images)
    for i, (x0, y0, bw, bh) in enumerate(np.asarray(boxes, np.int64)):
        cx, cy = x0 + bw // 2, y0 + bh // 2
        left = int(np.clip(cx - side // 2, 0, w - side))
        top = int(np.clip(cy - side // 2, 0, h - side))
        crop = images[i, top:top + side, left:left + side]
        out[i] = np.repeat(np.repeat(crop, h // side, 0), w // side, 1)
    return out


def low_resolution(images: np.ndarray, factor: int) -> np.ndarray:
    """``images`` box-filtered down by ``factor`` (:func:`lab.data.downsample`) and repeated
    back to their size: the same token grid, the detail of the low resolution."""
    from lab.data import downsample

    small = downsample(images, factor)
    return np.repeat(np.repeat(small, factor, -3), factor, -2)


def centre_tokens(grid_side: int) -> np.ndarray:
    """Indices of the centre ``2 x 2`` of a ``grid_side x grid_side`` token grid (row-major)."""
    if grid_side < 2:
        raise ValueError(f"grid_side={grid_side}; the centre 2 x 2 needs a grid of >= 2")
    lo = grid_side // 2 - 1
    return np.array([(lo + r) * grid_side + lo + c for r in (0, 1) for c in (0, 1)])


def zoom_features(model, images: np.ndarray, boxes, *, side: int | None = None
                  ) -> np.ndarray:
    """GeLVR's geometry target ``[B, 4, D]``: ``model``'s merged visual tokens of the
    :func:`zoom` (half the image's side, so the object at twice its size), the centre
    ``2 x 2``."""
    images = np.asarray(images)
    size = images.shape[1]
    side = side or size // 2
    crops = zoom(images, boxes, side)
    cfg = model.config
    pixels = zvlm.patchify(crops, cfg)
    g = size // cfg.vision.patch_size
    grid = np.array([[1, g, g]] * len(images))
    feats, _ = _visual(model, jnp.asarray(pixels), grid=tuple(map(tuple, grid.tolist())))
    per = zvlm.tokens_per_frame(cfg, size)
    feats = np.asarray(feats).reshape(len(images), per, -1)
    return feats[:, centre_tokens(int(round(math.sqrt(per))))]


@functools.partial(nnx.jit, static_argnames=("grid",))
def _visual(model, pixels, *, grid):
    return model.visual(pixels, np.array(grid))
