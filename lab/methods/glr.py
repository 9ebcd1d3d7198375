"""GLR: geometric latent reasoning in the LM's token-embedding space, and Coconut.

Geometric Latent Reasoning (GLR, NeurIPS 2026, "geometric latent reasoning induces
substantially shorter generations without an explicit length objective") treats latent
reasoning as path approximation in the pretrained token-embedding space: a lightweight
:class:`TransitionHead` reads the LM's last hidden state and predicts a *direction
update* ``z_{j+1} = z_j + g(h_j)`` of the current latent point, which is fed back through
``inputs_embeds`` for ``L`` latent steps before the model decodes text. Training anchors
the latent path on the textual chain of thought: latent step ``j`` replaces chain step
``j``, whose token embeddings' mean ``a_j`` is its anchor, and the anchor loss
``relu(||z_j - a_j|| / ||a_j|| - margin)^2`` pulls ``z_j`` to within a relative
``margin`` of it (room to deviate from exact token embeddings), plus the cross-entropy
of the explicit continuation (the remaining steps and the answer).

The Coconut baseline (Hao et al. 2024, "Training Large Language Models to Reason in a
Continuous Latent Space") feeds the last hidden state (after the final norm, as Hugging
Face's ``hidden_states[-1]``) back as the next input embedding, trained on the
continuation's cross-entropy alone. Both use Coconut's curriculum: stage ``k`` replaces
the first ``k`` chain steps by ``k`` latent steps (one per step, Coconut's ``c = 1``).

Inference (:func:`latent_generate`) is one jitted program on the core's KV cache
(:class:`lab.nn.KVCache`, :func:`lab.infer.decode.loop`): the prompt is prefilled once,
each latent step feeds one embedding onto the cache (``lax.scan``), and the decode loop
continues from the last latent position. :func:`reference_generate` is the unjitted
step-by-step reference that re-runs the whole prefix each step.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from lab.data.synthetic.base import ANSWER_PREFIX
from lab.infer import decode
from lab.infer.options import Eviction, GenerateOptions
from lab.nn import KVCache

MODES = ("glr", "coconut")


class TransitionHead(nnx.Module):
    """GLR's transition head: ``(h [..., D], z [..., D]) -> z + W2 gelu(W1 norm(h))``.

    ``h`` is the LM's last block output at the current position, ``z`` the current latent
    point in the token-embedding space (the embedding of the prompt's last token at the
    first step); the head predicts the direction update. ``W2`` starts at zero, so the
    untrained head stays at ``z``.
    """

    def __init__(self, d_model: int, hidden: int | None = None, *, rngs: nnx.Rngs):
        if not isinstance(d_model, int) or d_model < 1:
            raise ValueError(f"TransitionHead d_model={d_model!r}; expected an int >= 1")
        hidden = hidden or 2 * d_model
        self.d_model = d_model
        self.norm = nnx.RMSNorm(d_model, rngs=rngs)
        self.inp = nnx.Linear(d_model, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, d_model, kernel_init=nnx.initializers.zeros, rngs=rngs)

    def __call__(self, h: jax.Array, z: jax.Array) -> jax.Array:
        return z + self.out(jax.nn.gelu(self.inp(self.norm(h)))).astype(z.dtype)


def check_model(model, head: TransitionHead | None = None, mode: str = "glr") -> None:
    """Raises ValueError unless ``model`` takes ``inputs_embeds`` and a KV cache (a
    :class:`lab.nn.Transformer`), ``mode`` is one of :data:`MODES` and ``head`` (needed for
    ``"glr"``) has the model's ``d_model``."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; expected one of {MODES}")
    params = inspect.signature(model).parameters if callable(model) else {}
    if not all(hasattr(model, a) for a in ("embed", "blocks", "unembed", "config")) \
            or "inputs_embeds" not in params or "cache" not in params:
        raise ValueError(f"model {type(model).__name__} does not take inputs_embeds= and "
                         "cache=; latent reasoning needs a lab.nn.Transformer")
    if mode == "glr":
        if not isinstance(head, TransitionHead):
            raise ValueError(f"mode='glr' needs a TransitionHead, got {type(head).__name__}")
        if head.d_model != model.config.d_model:
            raise ValueError(f"TransitionHead d_model={head.d_model} does not match the "
                             f"model's d_model={model.config.d_model}")


def check_budget(latent_steps) -> int:
    """``latent_steps`` as an int; ValueError unless it is an int >= 0."""
    if not isinstance(latent_steps, (int, np.integer)) or isinstance(latent_steps, bool) \
            or latent_steps < 0:
        raise ValueError(f"latent_steps={latent_steps!r}; expected an int >= 0 (the latent "
                         "budget L)")
    return int(latent_steps)


def next_latent(model, head, h: jax.Array, z: jax.Array, mode: str) -> jax.Array:
    """The next input embedding from the last block output ``h [B, D]`` and the current
    latent point ``z [B, D]``: GLR's ``head(h, z)``, Coconut's ``norm(h)``."""
    if mode == "glr":
        return head(h, z)
    return model.norm(h).astype(z.dtype)


class LatentGeneration(NamedTuple):
    """What :func:`latent_generate` returns.

    tokens:  ``[B, N]`` explicit tokens after the latent steps (``pad_id`` after EOS).
    lengths: ``[B]`` explicit tokens per row, EOS included.
    latents: ``[B, L, D]`` the fed latent embeddings.
    """

    tokens: jax.Array
    lengths: jax.Array
    latents: jax.Array


def _last(x, lengths):
    """``x [B, T, ...]`` at index ``lengths - 1`` per row."""
    idx = (lengths - 1).reshape((-1, 1) + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=1)[:, 0]


@functools.partial(jax.jit, static_argnames=("graphdef", "max_latent", "mode", "opts",
                                             "capacity"))
def _latent_jit(graphdef, state, tokens, lengths, budget, *, max_latent, mode, opts, capacity):
    model, head = nnx.merge(graphdef, state)
    b, t = tokens.shape
    cache = KVCache.init(model.config, b, capacity)
    valid = jnp.arange(t)[None, :] < lengths[:, None]
    _, cache, inter = model(tokens, cache=cache, mask=valid, capture=("hidden",))
    h_all = _last(jnp.moveaxis(inter.hidden, 0, 2), lengths)        # [B, n_layers+1, D]
    z0 = _last(model.embed(tokens), lengths)

    def step(carry, j):
        cache, h_all, z = carry
        active = j < budget                                          # [B]
        z_new = next_latent(model, head, h_all[:, -1], z, mode)
        # an inactive row writes an empty slot (position -1) and does not advance
        _, cache, inter = model(inputs_embeds=z_new[:, None], cache=cache,
                                mask=active[:, None], capture=("hidden",))
        h_new = jnp.moveaxis(inter.hidden, 0, 2)[:, 0]
        h_all = jnp.where(active[:, None, None], h_new, h_all)
        z = jnp.where(active[:, None], z_new, z)
        return (cache, h_all, z), jnp.where(active[:, None], z_new, 0.0)

    (cache, h_all, _), zs = jax.lax.scan(step, (cache, h_all, z0), jnp.arange(max_latent))
    logits = model.unembed(h_all[:, -1])
    first = jnp.argmax(logits, -1).astype(jnp.int32)
    lp = jnp.take_along_axis(jax.nn.log_softmax(logits), first[:, None], 1)[:, 0]
    out = decode.loop(model, cache, (first, lp, jnp.moveaxis(h_all, 1, 0)), jax.random.key(0),
                      jnp.float32(1.0), jnp.zeros((b,), jnp.int32), opts=opts,
                      eviction=Eviction(None, capacity=capacity))
    zs = jnp.moveaxis(zs, 0, 1) if max_latent else jnp.zeros((b, 0, z0.shape[-1]), z0.dtype)
    return LatentGeneration(out[0], out[3], zs)


def latent_generate(model, head, tokens, lengths, *, latent_steps, mode: str = "glr",
                    max_new_tokens: int, eos_id: int, pad_id: int = 0,
                    max_latent_steps: int | None = None) -> LatentGeneration:
    """Greedy generation with ``latent_steps`` latent steps between the prompt and the text.

    ``tokens [B, T]`` right-padded prompts with ``lengths [B]``. The prompt is prefilled
    onto a KV cache, each latent step feeds :func:`next_latent` through ``inputs_embeds``
    at the next position, then the core's decode loop writes up to ``max_new_tokens``
    tokens, stopping at ``eos_id``. ``latent_steps``: an int, or ``[B]`` ints (one budget
    per row); the budget is a run-time argument, so every budget up to
    ``max_latent_steps`` (default: the largest asked) shares one compiled program.
    """
    check_model(model, head, mode)
    budget = np.asarray(latent_steps)
    if budget.ndim == 0:
        budget = np.full(np.shape(tokens)[:1], check_budget(latent_steps), np.int64)
    for v in budget.ravel().tolist():
        check_budget(v)
    most = int(budget.max()) if max_latent_steps is None else check_budget(max_latent_steps)
    if budget.max() > most:
        raise ValueError(f"latent_steps={int(budget.max())} exceeds max_latent_steps={most}")
    tokens = np.asarray(tokens, np.int32)
    lengths = np.asarray(lengths, np.int32)
    if tokens.ndim != 2 or lengths.shape != tokens.shape[:1] or budget.shape != lengths.shape:
        raise ValueError(f"tokens has shape {tokens.shape}, lengths {lengths.shape} and "
                         f"latent_steps {budget.shape}; expected [B, T], [B] and [B] or an int")
    if lengths.min() < 1 or lengths.max() > tokens.shape[1]:
        raise ValueError(f"lengths={lengths.tolist()}; expected each in [1, {tokens.shape[1]}]")
    capacity = tokens.shape[1] + most + max_new_tokens + 1
    if capacity > model.config.max_len:
        raise ValueError(f"prompt {tokens.shape[1]} + latent_steps {most} + "
                         f"max_new_tokens {max_new_tokens} exceeds TransformerConfig.max_len="
                         f"{model.config.max_len}")
    opts = GenerateOptions(max_new_tokens, stop_tokens=(eos_id,), pad_id=pad_id).static()
    graphdef, state = nnx.split((model, head if mode == "glr" else None))
    return _latent_jit(graphdef, state, jnp.asarray(tokens), jnp.asarray(lengths),
                       jnp.asarray(budget, jnp.int32), max_latent=most, mode=mode, opts=opts,
                       capacity=capacity)


def _hidden_last(model, x):
    """The last block output at the last position of ``x [B, T, D]`` (no cache)."""
    _, inter = model(inputs_embeds=x, capture=("hidden",))
    return inter.hidden[-1][:, -1], model.unembed(inter.hidden[-1][:, -1])


_full_forward = nnx.jit(_hidden_last)


def reference_generate(model, head, tokens, *, latent_steps: int, mode: str = "glr",
                       max_new_tokens: int, eos_id: int, pad_id: int = 0) -> LatentGeneration:
    """The step-by-step reference of :func:`latent_generate` for equal-length prompts
    ``tokens [B, T]``: a Python loop (no jitted loop, no cache) in which every latent
    step and every token re-runs the whole prefix through the model's plain forward."""
    check_model(model, head, mode)
    latent_steps = check_budget(latent_steps)
    tokens = jnp.asarray(tokens, jnp.int32)
    x = model.embed(tokens)
    z = x[:, -1]
    h, logits = _full_forward(model, x)
    zs = []
    for _ in range(latent_steps):
        z = next_latent(model, head, h, z, mode)
        zs.append(z)
        x = jnp.concatenate([x, z[:, None]], axis=1)
        h, logits = _full_forward(model, x)
    b = tokens.shape[0]
    out = np.full((b, max_new_tokens), pad_id, np.int32)
    done = np.zeros(b, bool)
    n = np.zeros(b, np.int32)
    for i in range(max_new_tokens):
        tok = np.asarray(jnp.argmax(logits, -1), np.int32)
        out[:, i] = np.where(done, pad_id, tok)
        n += ~done
        done |= tok == eos_id
        if done.all():
            break
        x = jnp.concatenate([x, model.embed(jnp.asarray(tok))[:, None]], axis=1)
        h, logits = _full_forward(model, x)
    latents = jnp.stack(zs, 1) if zs else jnp.zeros((b, 0, x.shape[-1]), x.dtype)
    return LatentGeneration(jnp.asarray(out), jnp.asarray(n), latents)


# ----------------------------------------------------------------------------- data


def chain_steps(completion: str) -> tuple[list[str], str]:
    """``(steps, answer)`` of an arithmetic completion ``"23+7=30;30-15=15\\nA: 15"``."""
    line, _, rest = completion.partition("\n")
    if not rest.startswith(ANSWER_PREFIX):
        raise ValueError(f"completion={completion!r}; expected '<steps>\\nA: <answer>'")
    return ([s for s in line.split(";") if s] if line else []), rest[len(ANSWER_PREFIX):]


def continuation(completion: str, k: int) -> str:
    """The explicit text after ``k`` latent steps: the chain without its first ``k`` steps,
    then the answer line (``"\\nA: 15"`` once every step is latent)."""
    steps, answer = chain_steps(completion)
    return ";".join(steps[k:]) + "\n" + ANSWER_PREFIX + answer


class StageData(NamedTuple):
    """One curriculum stage's training arrays (every row's prompt has the same length).

    prompt: ``[N, Tp]``; text ``[N, Tt]`` the continuation + EOS, right-padded, with
    ``text_mask``; anchors ``[N, k, S]`` the token ids of the replaced steps with
    ``anchor_mask``.
    """

    prompt: np.ndarray
    text: np.ndarray
    text_mask: np.ndarray
    anchors: np.ndarray
    anchor_mask: np.ndarray


def stage_data(tokenizer, prompts: Sequence[str], completions: Sequence[str], k: int,
               text_len: int, anchor_len: int = 16, n_anchors: int | None = None
               ) -> StageData:
    """Tokenised rows whose text drops the first ``k`` chain steps (BOS + prompt;
    continuation + EOS padded to ``text_len``) with the anchors of the first
    ``n_anchors`` (default ``k``) steps; ValueError when prompts differ in length, a chain
    has fewer steps than asked or a continuation exceeds ``text_len``."""
    k = check_budget(k)
    n_anchors = k if n_anchors is None else check_budget(n_anchors)
    ps = [tokenizer.encode(p, add_bos=True) for p in prompts]
    if len({len(p) for p in ps}) != 1:
        raise ValueError(f"prompts have lengths {sorted({len(p) for p in ps})}; training "
                         "batches need prompts of one length (one steps x digits level)")
    n = len(ps)
    text = np.full((n, text_len), tokenizer.pad_id, np.int32)
    text_mask = np.zeros((n, text_len), np.float32)
    anchors = np.full((n, max(n_anchors, 1), anchor_len), tokenizer.pad_id, np.int32)
    anchor_mask = np.zeros((n, max(n_anchors, 1), anchor_len), np.float32)
    for i, c in enumerate(completions):
        steps, _ = chain_steps(c)
        if len(steps) < max(k, n_anchors):
            raise ValueError(f"row {i} has {len(steps)} chain steps < {max(k, n_anchors)}")
        ids = tokenizer.encode(continuation(c, k), add_eos=True)
        if len(ids) > text_len:
            raise ValueError(f"row {i}'s continuation has {len(ids)} tokens > text_len="
                             f"{text_len}")
        text[i, :len(ids)] = ids
        text_mask[i, :len(ids)] = 1
        for j in range(n_anchors):
            a = tokenizer.encode(steps[j])[:anchor_len]
            anchors[i, j, :len(a)] = a
            anchor_mask[i, j, :len(a)] = 1
    return StageData(np.asarray(ps, np.int32), text, text_mask, anchors, anchor_mask)


# ----------------------------------------------------------------------------- training


def anchor_points(model, anchors: jax.Array, anchor_mask: jax.Array) -> jax.Array:
    """``[B, k, D]`` the mean token embedding of each replaced chain step (the anchor
    path's points), held fixed (no gradient) as targets."""
    e = model.embed(anchors)
    m = anchor_mask[..., None]
    return jax.lax.stop_gradient((e * m).sum(2) / jnp.maximum(m.sum(2), 1.0))


def latent_loss(model, head, batch: dict, *, k, max_k: int, mode: str,
                anchor_weight: float = 1.0, margin: float = 0.25):
    """Stage-``k`` loss of a batch (:class:`StageData` fields as arrays) and its parts.

    The latent steps are unrolled by re-running the prefix (prompt + latents so far) each
    step, as Coconut's training does; ``k`` may be traced (one program serves every stage
    up to the static ``max_k``: the sequence holds ``max_k`` latent slots, the text is
    written right after the ``k``-th). The continuation's cross-entropy is the answer
    loss; ``mode="glr"`` adds ``anchor_weight`` times the anchor loss
    ``mean_j relu(||z_j - a_j|| / ||a_j|| - margin)^2`` over the ``k`` latent steps.
    """
    prompt, text, mask = batch["prompt"], batch["text"], batch["text_mask"]
    tp, tt = prompt.shape[1], text.shape[1]
    x = jnp.concatenate([model.embed(prompt),
                         jnp.zeros((prompt.shape[0], max_k, model.config.d_model),
                                   model.config.jnp_dtype)], axis=1)
    z = x[:, tp - 1]
    zs = []
    for j in range(max_k):
        _, inter = model(inputs_embeds=x[:, :tp + j], capture=("hidden",))
        z_new = next_latent(model, head, inter.hidden[-1][:, -1], z, mode)
        z = jnp.where(j < k, z_new, z)
        zs.append(z_new)
        x = x.at[:, tp + j].set(z_new)
    full = jnp.concatenate([x, jnp.zeros((x.shape[0], tt, x.shape[2]), x.dtype)], axis=1)
    full = jax.lax.dynamic_update_slice_in_dim(full, model.embed(text), tp + k, axis=1)
    logits = jax.lax.dynamic_slice_in_dim(model(inputs_embeds=full), tp + k - 1, tt, axis=1)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, text)
    answer = (ce * mask).sum() / jnp.maximum(mask.sum(), 1.0)
    anchor = jnp.float32(0.0)
    if max_k and mode == "glr":
        a = anchor_points(model, batch["anchors"][:, :max_k], batch["anchor_mask"][:, :max_k])
        rel = jnp.linalg.norm(jnp.stack(zs, 1) - a, axis=-1) / (
            jnp.linalg.norm(a, axis=-1) + 1e-6)
        on = (jnp.arange(max_k) < k).astype(jnp.float32)[None, :]
        anchor = jnp.sum(jax.nn.relu(rel - margin) ** 2 * on) / jnp.maximum(
            on.sum() * rel.shape[0], 1.0)
    loss = answer + (anchor_weight * anchor if mode == "glr" else 0.0)
    return loss, {"loss": loss, "answer_loss": answer, "anchor_loss": anchor}


@functools.partial(nnx.jit, static_argnames=("max_k", "mode", "anchor_weight", "margin"))
def _train_step(model, head, opt, batch, k, *, max_k, mode, anchor_weight, margin):
    pair = (model, head)

    def f(pair):
        return latent_loss(pair[0], pair[1], batch, k=k, max_k=max_k, mode=mode,
                           anchor_weight=anchor_weight, margin=margin)

    (_, parts), grads = nnx.value_and_grad(f, has_aux=True)(pair)
    opt.update(pair, grads)
    return parts


def make_optimizer(model, head, learning_rate: float, steps: int, warmup: int = 0):
    """AdamW (weight decay 0.01, clip 1.0) on the LM and the head together: a linear
    warm-up over ``warmup`` updates (so a fresh optimizer's first steps do not knock a
    trained model off its solution), then a cosine decay to ``steps``."""
    return nnx.Optimizer((model, head), _transform(float(learning_rate), int(steps),
                                                  int(warmup)), wrt=nnx.Param)


@functools.cache
def _transform(learning_rate: float, steps: int, warmup: int):
    # One transformation object per schedule: it is static in the optimizer's graph, so a
    # fresh optimizer per curriculum stage reuses the compiled train step instead of
    # compiling it anew.
    schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, min(warmup, steps - 1),
                                                  max(steps, 1)) if warmup else \
        optax.cosine_decay_schedule(learning_rate, max(steps, 1))
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))


def train_stage(model, head, opt, data: StageData, *, k: int, mode: str, steps: int,
                batch_size: int, seed: int, max_k: int | None = None,
                anchor_weight: float = 1.0, margin: float = 0.25) -> list[dict]:
    """``steps`` updates of stage ``k`` (``k`` latent steps) on batches drawn from
    ``data``; returns per-step ``{"loss", "answer_loss", "anchor_loss"}``. ``mode="glr"``
    trains the LM and the head, ``"coconut"`` the LM (the head is unused). Stages up to
    ``max_k`` (default ``k``) share one compiled step."""
    check_model(model, head, "glr")
    check_model(model, head, mode)
    k = check_budget(k)
    max_k = k if max_k is None else check_budget(max_k)
    if k > max_k or data.anchors.shape[1] < max(max_k, 1):
        raise ValueError(f"k={k}, max_k={max_k} with {data.anchors.shape[1]} anchor steps; "
                         "expected k <= max_k <= the stage data's anchor steps")
    rng = np.random.default_rng([seed, k])
    history = []
    for _ in range(steps):
        idx = rng.integers(0, data.prompt.shape[0], batch_size)
        batch = {f: jnp.asarray(getattr(data, f)[idx]) for f in StageData._fields}
        parts = _train_step(model, head, opt, batch, jnp.int32(k), max_k=max_k, mode=mode,
                            anchor_weight=float(anchor_weight), margin=float(margin))
        history.append({n: float(v) for n, v in parts.items()})
    return history


__all__ = ["MODES", "LatentGeneration", "StageData", "TransitionHead", "anchor_points",
           "chain_steps", "check_budget", "check_model", "continuation", "latent_generate",
           "latent_loss", "make_optimizer", "next_latent", "reference_generate",
           "stage_data", "train_stage"]
