"""Next-token choice: greedy, temperature, top-k and top-p (nucleus) sampling.

Follows Hugging Face's logits warpers (``TemperatureLogitsWarper``,
``TopKLogitsWarper``, ``TopPLogitsWarper``): temperature first, then top-k,
then top-p keeps the smallest set of most likely tokens whose mass reaches
``top_p`` (at least one token).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -1e30


def check(temperature: float, top_k: int | None, top_p: float | None, vocab_size: int) -> None:
    """Raises ValueError naming a sampling argument outside its range."""
    if not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(f"temperature={temperature!r}; expected a float >= 0 (0 = greedy)")
    if top_k is not None and (not isinstance(top_k, int) or not 1 <= top_k <= vocab_size):
        raise ValueError(f"top_k={top_k!r}; expected None or an int in [1, {vocab_size}]")
    if top_p is not None and (not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise ValueError(f"top_p={top_p!r}; expected None or a float in (0, 1]")


def warp(logits: jax.Array, temperature: jax.Array, top_k: int | None,
         top_p: float | None) -> jax.Array:
    """Tempered logits ``[B, V]`` with the tokens outside top-k / top-p set to -1e30."""
    z = logits.astype(jnp.float32) / temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth = jax.lax.top_k(z, top_k)[0][..., -1:]
        z = jnp.where(z < kth, NEG_INF, z)
    if top_p is not None and top_p < 1.0:
        sorted_z = jnp.sort(z, axis=-1)[..., ::-1]
        probs = jax.nn.softmax(sorted_z, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs     # mass of strictly better tokens
        kept = before < top_p                            # the first token is always kept
        threshold = jnp.min(jnp.where(kept, sorted_z, jnp.inf), axis=-1, keepdims=True)
        z = jnp.where(z < threshold, NEG_INF, z)
    return z


def choose(logits: jax.Array, key: jax.Array, temperature: jax.Array, *, greedy: bool,
           top_k: int | None, top_p: float | None) -> tuple[jax.Array, jax.Array]:
    """Picks one token per row of ``logits [B, V]``.

    Returns:
      ``(tokens [B] int32, logprobs [B] float32)``: the log-probability of the
      chosen token under the untempered, unfiltered model distribution.
    """
    logits = logits.astype(jnp.float32)
    if greedy:
        tok = jnp.argmax(logits, axis=-1)
    else:
        tok = jax.random.categorical(key, warp(logits, temperature, top_k, top_p), axis=-1)
    tok = tok.astype(jnp.int32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return tok, jnp.take_along_axis(logp, tok[:, None], axis=-1)[:, 0]
