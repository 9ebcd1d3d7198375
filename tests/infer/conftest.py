"""Shared fixtures for lab.infer tests: one tiny model and one jitted reference forward.

Every reference computation is a plain full forward over a ``[2, 18]`` batch
(right-padded rows; in a causal model trailing padding changes nothing before
it), so the whole test set compiles the reference once.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lab.nn import Transformer, TransformerConfig

# init_std=0.5 gives peaked, varied next-token distributions (clear argmax margins).
CFG = TransformerConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                        head_dim=16, d_ff=128, max_len=48, rope_theta=5000.0, init_std=0.5)
REF_SHAPE = (2, 18)


@pytest.fixture(scope="session")
def model():
    return Transformer(CFG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="session")
def reference(model):
    """``reference(rows, mask=None) -> (logits [2, 18, V], Intermediates(hidden, attn))``.

    rows: two lists of ids (each at most 18 long, right-padded with 0);
    mask: optional boolean ``[2, Hkv, 18, 18]`` restriction (True = may attend).
    """
    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, seq, mask):
        return nnx.merge(graphdef, state)(seq, mask=mask, capture=("hidden", "attn"))

    def run(rows, mask=None):
        seq = np.zeros(REF_SHAPE, np.int32)
        for b, r in enumerate(rows):
            seq[b, :len(r)] = r
        if mask is None:
            mask = np.ones((2, CFG.n_kv_heads) + REF_SHAPE[1:] * 2, bool)
        return forward(state, jnp.asarray(seq), jnp.asarray(mask))

    return run
