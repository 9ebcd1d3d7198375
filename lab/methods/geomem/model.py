"""The one-layer transformer of the geometric-memorization setting, in Flax NNX.

Embeddings (entities and hop-tagged relation tokens kept in two tables so that
subject embeddings can be re-initialised alone), one attention layer read at
the last position, a ReLU MLP with a residual, and an unembedding onto the
entities. Only the last position is predicted, so attention is computed for
that query alone (what a causal layer computes there). Left padding
(:data:`PAD` tokens, masked out of attention) lets prefixes of different lengths
share a batch: the chain-of-thought steps of one sequence are its prefixes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

PAD = -1
"""Token id of left padding: embedded as zero and never attended to."""


class OneLayer(nnx.Module):
    """``logits = U (h + W2 relu(W1 h + b1))`` with ``h = x_last + Wo attn(x)``.

    ``width``/``hidden_width`` zero-pad the parameters: the padded rows and
    columns have zero gradient (every path through them is a product with
    another zero weight, and ``relu'(0) = 0``), so they stay zero under Adam
    and a padded model computes and trains exactly as the ``d``-wide one, while
    models of every ``d`` share one compiled train step.

    Attributes:
      subjects: ``[N, d]`` entity (subject) embeddings.
      relations: ``[hops*R, d]`` relation-token embeddings.
      wq, wk, wv, wo: single-head attention projections ``[d, d]``.
      w1, b1, w2: the MLP ``d -> hidden -> d``.
      unembed: ``[N, d]`` attribute (entity) output vectors.
    """

    def __init__(self, n: int, n_relation_tokens: int, d: int, hidden: int, *,
                 rngs: nnx.Rngs, width: int | None = None, hidden_width: int | None = None):
        for name, v in (("n", n), ("n_relation_tokens", n_relation_tokens), ("d", d),
                        ("hidden", hidden)):
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"OneLayer {name}={v!r}; expected a positive int")
        width, hidden_width = width or d, hidden_width or hidden
        if width < d or hidden_width < hidden:
            raise ValueError(f"OneLayer width={width}, hidden_width={hidden_width} must be >= "
                             f"d={d}, hidden={hidden}")

        # Drawn with NumPy from one key of ``rngs``: a jax.random draw per parameter
        # shape would compile a program per shape, which dominates tiny models.
        seed = np.asarray(jax.random.key_data(rngs.params())).ravel().tolist()
        rng = np.random.default_rng(seed)

        def p(shape, fan_in, padded):
            w = np.zeros(padded, np.float32)
            w[:shape[0], :shape[1]] = rng.standard_normal(shape) / fan_in**0.5
            return nnx.Param(jnp.asarray(w))

        self.subjects = p((n, d), d, (n, width))
        self.relations = p((n_relation_tokens, d), d, (n_relation_tokens, width))
        self.wq, self.wk = p((d, d), d, (width, width)), p((d, d), d, (width, width))
        self.wv, self.wo = p((d, d), d, (width, width)), p((d, d), d, (width, width))
        self.w1 = p((d, hidden), d, (width, hidden_width))
        self.b1 = nnx.Param(jnp.zeros((hidden_width,), jnp.float32))
        self.w2 = p((hidden, d), hidden, (hidden_width, width))
        self.unembed = p((n, d), d, (n, width))
        # The true width as data, not a Python attribute, so that models of every
        # d padded to one width share one compiled program.
        self.dim = nnx.Variable(jnp.asarray(d, jnp.int32))
        self.n = n

    @property
    def d(self) -> int:
        """The model's embedding dimension (columns beyond it are zero and stay zero)."""
        return int(self.dim[...])

    def embed(self, tokens: jax.Array) -> jax.Array:
        """``[B, T]`` token ids -> ``[B, T, d]``: entity ids below ``N``, relation tokens
        above, and :data:`PAD` (negative) as the zero vector."""
        table = jnp.concatenate([self.subjects[...], self.relations[...]], axis=0)
        return jnp.where((tokens >= 0)[..., None], table[jnp.maximum(tokens, 0)], 0.0)

    def __call__(self, tokens: jax.Array, *, capture: bool = False):
        """``tokens [B, T]`` (the last one is never :data:`PAD`). Returns logits ``[B, N]``
        at the last position, and with ``capture`` the
        dict ``{"h": [B, d] MLP input, "z": [B, hidden] ReLU activations}``."""
        x = self.embed(tokens)
        q = x[:, -1] @ self.wq[...]
        k = x @ self.wk[...]
        v = x @ self.wv[...]
        scale = jax.lax.rsqrt(self.dim[...].astype(jnp.float32))
        scores = jnp.einsum("bd,btd->bt", q, k) * scale
        probs = jax.nn.softmax(jnp.where(tokens >= 0, scores, -jnp.inf), axis=-1)
        h = x[:, -1] + jnp.einsum("bt,btd->bd", probs, v) @ self.wo[...]
        z = jax.nn.relu(h @ self.w1[...] + self.b1[...])
        out = h + z @ self.w2[...]
        logits = out @ self.unembed[...].T
        return (logits, {"h": h, "z": z}) if capture else logits


@functools.partial(jax.jit, static_argnums=0)
def _predict(graphdef, state, tokens):
    return jnp.argmax(nnx.merge(graphdef, state)(tokens), -1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=0)
def _capture(graphdef, state, tokens):
    return nnx.merge(graphdef, state)(tokens, capture=True)


def capture(model: OneLayer, tokens: jax.Array) -> tuple[jax.Array, dict]:
    """Jitted ``model(tokens, capture=True)``: logits and ``{"h", "z"}`` (one compile per shape)."""
    graphdef, state = nnx.split(model)
    return _capture(graphdef, state, tokens)


def predict(model: OneLayer, tokens: jax.Array, batch: int = 8192) -> jax.Array:
    """Argmax predictions ``[B]`` int32 (evaluated in chunks; compiled once per shape)."""
    graphdef, state = nnx.split(model)
    return jnp.concatenate([_predict(graphdef, state, tokens[i:i + batch])
                            for i in range(0, tokens.shape[0], batch)])


def accuracy(model: OneLayer, tokens: jax.Array, answers: jax.Array) -> float:
    """Fraction of queries whose argmax logit is the answer."""
    return float(jnp.mean(predict(model, tokens) == answers))
