"""GPA's frozen generators: an autoregressive DNA LM and a masked discrete-diffusion model.

Both are :class:`lab.nn.Transformer` models over the alphabet ACGT (ids 0-3)
plus one special id 4: BOS for the autoregressive model, MASK for the
diffusion model, which is the same Transformer with ``causal=False``.

* Autoregressive: trained by next-token cross-entropy on ``[BOS] + x``; the
  exact log-likelihood is a sum of conditionals. :func:`ar_resample_suffix`
  keeps each particle's prefix ``x[:k]`` and resamples the suffix (used to
  sample); :func:`ar_resample_span` / :func:`ar_span_proposal` resample a span
  anywhere given its prefix and return the Metropolis-Hastings correction (the
  suffix's likelihood ratio), GPA's AR move.
* Masked diffusion (absorbing state, MDLM: Sahoo et al., 2024, linear schedule
  ``alpha_t = 1 - t``): trained on the negative ELBO
  ``E_t [ (1/t) sum_{i masked} -log p(x_i | z_t) ]``, which bounds ``-log p(x)``
  from above (:func:`diffusion_nelbo`); sampled by the ancestral sampler;
  :func:`diffusion_remask` is the re-mask-and-denoise move: mask ``m``
  positions, fill them from the denoiser's marginals in one pass;
  :func:`diffusion_proposal` adds its full MH correction.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab.data.batching import step_indices
from lab.nn import KVCache, Transformer, TransformerConfig
from lab.train import TrainConfig, Trainer, sft_loss

SPECIAL = 4  # BOS (autoregressive) or MASK (diffusion)
VOCAB = 5


def generator_config(kind: str, seq_len: int, *, d_model: int = 64, n_layers: int = 2,
                     n_heads: int = 4) -> TransformerConfig:
    if kind not in ("ar", "diffusion"):
        raise ValueError(f"generator kind={kind!r}; expected 'ar' or 'diffusion'")
    return TransformerConfig(vocab_size=VOCAB, d_model=d_model, n_layers=n_layers,
                             n_heads=n_heads, n_kv_heads=max(1, n_heads // 2),
                             head_dim=d_model // n_heads, d_ff=4 * d_model,
                             max_len=seq_len + 1, causal=(kind == "ar"), qk_norm=True)


def _batches(data: np.ndarray, batch_size: int, seed: int):
    """``batch_fn(step)`` over the rows of ``data`` (lab.data's step-indexed epochs)."""
    return lambda step: data[step_indices(data.shape[0], batch_size, step, seed)]


# --- autoregressive ------------------------------------------------------------------------


def ar_batch(seqs):
    seqs = jnp.asarray(seqs, jnp.int32)
    inputs = jnp.concatenate([jnp.full((seqs.shape[0], 1), SPECIAL, jnp.int32), seqs[:, :-1]], 1)
    return {"inputs": inputs, "targets": seqs, "mask": jnp.ones(seqs.shape, jnp.float32)}


def train_ar(seqs: np.ndarray, train: TrainConfig, *, batch_size: int = 64, **model_kw):
    """Trains the autoregressive DNA LM on ``seqs [n, L]``; returns the model."""
    model = Transformer(generator_config("ar", seqs.shape[1], **model_kw),
                        rngs=nnx.Rngs(train.seed))
    data = _batches(np.asarray(seqs), batch_size, train.seed)
    Trainer(model, sft_loss, train).fit(lambda s: ar_batch(data(s)))
    return model


def ar_loglik(model: Transformer, seqs) -> jax.Array:
    """Exact ``log p(x)`` per sequence ``[n]`` (nats)."""
    b = ar_batch(seqs)
    logits = model(b["inputs"])[..., :4]
    logp = jax.nn.log_softmax(logits)
    return jnp.take_along_axis(logp, b["targets"][..., None], -1)[..., 0].sum(-1)


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("keep",))
def _ar_resample(graphdef, state, key, seqs, cut, *, keep: int):
    model = nnx.merge(graphdef, state)
    n, length = seqs.shape
    cache = KVCache.init(model.config, n, length + 1)
    start = jnp.full((n, 1), SPECIAL, jnp.int32)
    logp = jnp.zeros((n,), jnp.float32)
    tok = start
    if keep:  # the kept prefix in one forward: its conditionals, and the cache after it
        logits, cache = model(jnp.concatenate([start, seqs[:, :keep - 1]], 1), cache=cache)
        lp = jax.nn.log_softmax(logits[:, :, :4])
        logp = jnp.sum(jnp.take_along_axis(lp, seqs[:, :keep, None], -1)[..., 0], -1)
        tok = seqs[:, keep - 1:keep]

    def step(carry, j):
        tok, cache, out, logp = carry
        logits, cache = model(tok, cache=cache)
        lp = jax.nn.log_softmax(logits[:, -1, :4])
        sampled = jax.random.categorical(jax.random.fold_in(key, j), lp)
        x_j = jnp.where(j < cut, seqs[:, j], sampled)
        logp = logp + jnp.take_along_axis(lp, x_j[:, None], -1)[:, 0]
        out = out.at[:, j].set(x_j)
        return (x_j[:, None], cache, out, logp), None

    init = (tok, cache, seqs, logp)
    (_, _, out, logp), _ = jax.lax.scan(step, init, jnp.arange(keep, length))
    return out, logp


def ar_resample_suffix(model: Transformer, key, seqs, cut, *,
                       keep: int = 0) -> tuple[jax.Array, jax.Array]:
    """Keeps ``seqs[i, :cut[i]]`` and samples the rest from the LM (``cut = 0``: a fresh sample).

    ``keep``: a lower bound of every ``cut``; those first ``keep`` bases go through one
    forward (the prompt of the decode), and only the positions after them are decoded
    one by one on the KV cache (a suffix move with ``cut >= L - suffix_max`` decodes
    ``suffix_max`` steps, not ``L``). Position ``j``'s sample uses the key
    ``fold_in(key, j)`` whatever ``keep`` is.

    Returns ``(new_seqs [n, L], log p(new_seqs) [n])``.
    """
    graphdef, state = nnx.split(model)
    seqs = jnp.asarray(seqs, jnp.int32)
    cut = jnp.broadcast_to(jnp.asarray(cut, jnp.int32), (seqs.shape[0],))
    if not 0 <= keep <= seqs.shape[1]:
        raise ValueError(f"keep={keep}; expected 0 <= keep <= the sequence length "
                         f"{seqs.shape[1]}")
    if not isinstance(cut, jax.core.Tracer) and int(jnp.min(cut)) < keep:
        raise ValueError(f"keep={keep} but a row's cut is {int(jnp.min(cut))}; keep must "
                         "be at most every cut")
    return _ar_resample(graphdef, state, key, seqs, cut, keep=keep)


def position_logp(model, seqs):
    """``log p(x_j | x_<j)`` of every base ``[n, L]`` (one forward of ``[BOS] + x``)."""
    b = ar_batch(seqs)
    logp = jax.nn.log_softmax(model(b["inputs"])[..., :4])
    return jnp.take_along_axis(logp, b["targets"][..., None], -1)[..., 0]


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("span_max",))
def _ar_span(graphdef, state, key, seqs, start, span, *, span_max: int):
    model = nnx.merge(graphdef, state)
    n, length = seqs.shape
    rows = jnp.arange(n)
    lp_old = position_logp(model, seqs)
    # The cache after [BOS] + x[:-1], rewound per row to its span's start: slots >= start
    # are emptied (position -1), so decoding from there sees exactly the prefix x[:start].
    cache = KVCache.init(model.config, n, length + span_max)
    inputs = ar_batch(seqs)["inputs"]
    _, cache = model(inputs, cache=cache)
    slots = jnp.arange(cache.capacity)[None, None, None, :]
    cache = cache._replace(
        positions=jnp.where(slots >= start[None, :, None, None], -1, cache.positions),
        length=start, next_position=start)
    tok = jnp.take_along_axis(inputs, start[:, None], 1)  # x[start - 1], or BOS at 0

    def step(carry, j):
        tok, cache, out, logq = carry
        logits, cache = model(tok, cache=cache)
        lp = jax.nn.log_softmax(logits[:, -1, :4])
        pos = start + j
        inside = pos < length
        col = jnp.minimum(pos, length - 1)
        sampled = jax.random.categorical(jax.random.fold_in(key, j), lp)
        x_j = jnp.where(j < span, sampled, out[rows, col])
        out = out.at[rows, col].set(jnp.where(inside, x_j, out[rows, col]))
        logq = logq + jnp.where((j < span) & inside,
                                jnp.take_along_axis(lp, x_j[:, None], -1)[:, 0], 0.0)
        return (x_j[:, None], cache, out, logq), None

    init = (tok, cache, seqs, jnp.zeros((n,), jnp.float32))
    (_, _, new, logq), _ = jax.lax.scan(step, init, jnp.arange(span_max))
    lp_new = position_logp(model, new)
    after = jnp.arange(length)[None] >= (start + span)[:, None]
    within = (jnp.arange(length)[None] >= start[:, None]) & ~after
    log_corr = jnp.sum(jnp.where(after, lp_new - lp_old, 0.0), -1)
    return new, log_corr, {"logq_new": logq, "logq_new_forward": jnp.sum(within * lp_new, -1),
                           "logp_new": lp_new.sum(-1), "logp_old": lp_old.sum(-1)}


def ar_resample_span(model: Transformer, key, seqs, start, span, *, span_max: int):
    """Resamples ``x[start : start + span]`` of each row from the LM given its prefix, and
    returns the Metropolis-Hastings correction of that move for a target ``p(x) g(x)``.

    The proposal draws ``x'_j ~ p(x_j | x'_<j)`` for ``j`` in the span and keeps every
    other base, so ``q(x' | x) = prod_span p(x'_j | x'_<j)`` and the reverse move (same
    span) has ``q(x | x') = prod_span p(x_j | x_<j)``. In the MH ratio
    ``p(x') q(x | x') / (p(x) q(x' | x))`` the prefix and span factors cancel and what is
    left is the suffix's likelihood ratio (the resampled span changes the conditionals of
    every base after it):

        log_correction = sum_{j >= start + span} [log p(x'_j | x'_<j) - log p(x_j | x_<j)]

    (Metropolis-Hastings with an exact prefix-conditional proposal; with ``span`` reaching
    the end it is 0, the suffix move). ``start [n]`` in ``[0, L)``, ``span [n]`` in
    ``[1, span_max]`` (a span past the end is cut at ``L``). The decode runs
    ``span_max`` steps on a KV cache rewound to each row's start.

    Returns ``(new [n, L], log_correction [n], info)``; ``info`` holds the decoded
    ``log q(x' | x)`` and the same from a fresh forward of ``x'`` (they agree), and
    ``log p`` of the new and old rows.
    """
    seqs = jnp.asarray(seqs, jnp.int32)
    n, length = seqs.shape
    start = jnp.broadcast_to(jnp.asarray(start, jnp.int32), (n,))
    span = jnp.broadcast_to(jnp.asarray(span, jnp.int32), (n,))
    if span_max < 1:
        raise ValueError(f"span_max={span_max}; expected >= 1")
    if not isinstance(start, jax.core.Tracer):
        if int(jnp.min(start)) < 0 or int(jnp.max(start)) >= length:
            raise ValueError(f"start spans [{int(jnp.min(start))}, {int(jnp.max(start))}]; "
                             f"expected every start in [0, {length})")
        if int(jnp.min(span)) < 1 or int(jnp.max(span)) > span_max:
            raise ValueError(f"span spans [{int(jnp.min(span))}, {int(jnp.max(span))}]; "
                             f"expected every span in [1, span_max={span_max}]")
    graphdef, state = nnx.split(model)
    return _ar_span(graphdef, state, key, seqs, start, span, span_max=span_max)


def ar_span_proposal(model: Transformer, span_max: int):
    """``propose(key, x) -> (x', log_correction)``: the span move of :func:`ar_resample_span`
    with the start uniform over all ``L`` positions and the span length uniform over
    ``1..span_max``. The span's choice does not depend on ``x``, so it cancels in the MH
    ratio; every position changes with positive probability (a full-support LM), so the
    kernel reaches every sequence."""
    if span_max < 1:
        raise ValueError(f"span_max={span_max}; expected >= 1")

    def propose(key, x):
        ks, kl, kd = jax.random.split(key, 3)
        n, length = x.shape
        start = jax.random.randint(ks, (n,), 0, length)
        span = jax.random.randint(kl, (n,), 1, span_max + 1)
        new, corr, _ = ar_resample_span(model, kd, x, start, span, span_max=span_max)
        return new, corr

    return propose


def ar_sample(model: Transformer, key, n: int, length: int):
    """``n`` fresh sequences and their log-likelihoods."""
    return ar_resample_suffix(model, key, jnp.zeros((n, length), jnp.int32), 0)


# --- masked diffusion ------------------------------------------------------------------------


def denoise_logp(model: Transformer, z: jax.Array) -> jax.Array:
    """``log p(x_i | z)`` over ACGT for every position ``[n, L, 4]`` (MASK never predicted)."""
    return jax.nn.log_softmax(model(z)[..., :4])


def diffusion_loss(model: Transformer, batch, rng):
    """MDLM negative ELBO per base (linear schedule), a Monte-Carlo estimate over t and masks."""
    x = batch["x"]
    kt, km = jax.random.split(rng)
    t = jax.random.uniform(kt, (x.shape[0], 1), minval=1e-3, maxval=1.0)
    masked = jax.random.uniform(km, x.shape) < t
    z = jnp.where(masked, SPECIAL, x)
    nll = -jnp.take_along_axis(denoise_logp(model, z), x[..., None], -1)[..., 0]
    loss = jnp.mean(jnp.sum(masked * nll, -1) / t[:, 0]) / x.shape[1]
    return loss, {"loss": loss}


def train_diffusion(seqs: np.ndarray, train: TrainConfig, *, batch_size: int = 64, **model_kw):
    """Trains the masked-diffusion denoiser on ``seqs [n, L]``; returns the model."""
    model = Transformer(generator_config("diffusion", seqs.shape[1], **model_kw),
                        rngs=nnx.Rngs(train.seed))
    data = _batches(np.asarray(seqs), batch_size, train.seed)
    Trainer(model, diffusion_loss, train).fit(lambda s: {"x": jnp.asarray(data(s), jnp.int32)})
    return model


def diffusion_nelbo(model: Transformer, key, seqs, n_samples: int = 8) -> jax.Array:
    """Upper bound on ``-log p(x)`` per sequence ``[n]`` (nats), ``n_samples`` draws of t."""
    seqs = jnp.asarray(seqs, jnp.int32)

    def one(k):
        kt, km = jax.random.split(k)
        t = jax.random.uniform(kt, (seqs.shape[0], 1), minval=1e-3, maxval=1.0)
        masked = jax.random.uniform(km, seqs.shape) < t
        z = jnp.where(masked, SPECIAL, seqs)
        nll = -jnp.take_along_axis(denoise_logp(model, z), seqs[..., None], -1)[..., 0]
        return jnp.sum(masked * nll, -1) / t[:, 0]

    return jnp.mean(jnp.stack([one(k) for k in jax.random.split(key, n_samples)]), 0)


def diffusion_sample(model: Transformer, key, n: int, length: int, steps: int = 16):
    """Ancestral MDLM sampler: from all-MASK, unmask each position between t and s w.p. (t-s)/t."""
    graphdef, state = nnx.split(model)
    return _diffusion_sample(graphdef, state, key, n, length, steps)


@functools.partial(jax.jit, static_argnums=(0, 3, 4, 5))
def _diffusion_sample(graphdef, state, key, n: int, length: int, steps: int):
    model = nnx.merge(graphdef, state)
    z = jnp.full((n, length), SPECIAL, jnp.int32)
    ts = jnp.linspace(1.0, 0.0, steps + 1)
    for i in range(steps):
        key, ku, ks = jax.random.split(key, 3)
        t, s = ts[i], ts[i + 1]
        x = jax.random.categorical(ks, denoise_logp(model, z))
        reveal = (z == SPECIAL) & (jax.random.uniform(ku, z.shape) < (t - s) / t)
        z = jnp.where(reveal, x, z)
    return z


def diffusion_remask(model: Transformer, key, seqs, n_mask: int):
    """Re-mask ``n_mask`` random positions per sequence and refill them from the denoiser.

    Returns ``(new_seqs, log q(new | old), log q(old | new))``; both use the same
    masked context, so the reverse move is well defined.
    """
    seqs = jnp.asarray(seqs, jnp.int32)
    km, ks = jax.random.split(key)
    scores = jax.random.uniform(km, seqs.shape)
    kth = jnp.sort(scores, -1)[:, n_mask - 1:n_mask]
    masked = scores <= kth
    logp = denoise_logp(model, jnp.where(masked, SPECIAL, seqs))
    new = jnp.where(masked, jax.random.categorical(ks, logp), seqs)
    fwd = jnp.sum(masked * jnp.take_along_axis(logp, new[..., None], -1)[..., 0], -1)
    rev = jnp.sum(masked * jnp.take_along_axis(logp, seqs[..., None], -1)[..., 0], -1)
    return new, fwd, rev


def diffusion_proposal(model: Transformer, n_mask: int, prior_logp):
    """``propose(key, x) -> (x', log_correction)``: :func:`diffusion_remask` with the full
    Metropolis-Hastings correction for a target ``exp(prior_logp(x)) g(x)``:

        log_correction = prior_logp(x') - prior_logp(x) + log q(x | x') - log q(x' | x)

    (the masked set is uniform over subsets of size ``n_mask`` whatever ``x`` is, so its
    probability cancels). The denoiser fills the masked bases independently given the
    context, which is not the joint conditional of any prior, so the proposal ratio does
    not cancel against the prior's and must be kept (Hastings, 1970)."""
    if n_mask < 1:
        raise ValueError(f"n_mask={n_mask}; expected >= 1")
    graphdef, state = nnx.split(model)

    def propose(key, x):
        new, fwd, rev = _remask(graphdef, state, key, x, n_mask)
        return new, prior_logp(new) - prior_logp(x) + rev - fwd

    return propose


@functools.partial(jax.jit, static_argnums=(0, 4))
def _remask(graphdef, state, key, x, n_mask: int):
    return diffusion_remask(nnx.merge(graphdef, state), key, x, n_mask)
