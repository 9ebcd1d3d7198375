"""A reasoning task with a planted mechanism whose truth is known.

Task (token ids, digits mod ``M``): prompt ``BOS x1 x2 ... xn SEP``; the chain writes the
left-to-right partial sums ``c1 = x1 + x2``, ``c2 = c1 + x3``, ... (mod ``M``), then
``ANS`` and the answer ``c_{n-1}``, then ``EOS``. The reward is the answer's correctness,
an outcome of the whole sampled trajectory.

Plant: the model is trained so that a chosen set of MLP neurons gates the chain's *first*
step, several tokens before the answer. With the planted neurons ablated (scale 0) the
target chain skips ``x2`` (``c1 = x1``) and continues consistently from there, so the
answer is wrong (unless ``x2 = 0``); with as many random other neurons ablated, or none,
the target is the correct chain. The planted neurons' effect on the answer is thus
mediated by the trajectory: given a written chain, the answer copies its last partial
sum either way.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from lab.nn import Transformer, TransformerConfig

PAD, BOS, SEP, ANS, EOS = 0, 1, 2, 3, 4
DIGIT0 = 5  # token of digit 0


@dataclasses.dataclass(frozen=True)
class ChainTask:
    """``n_operands`` digits mod ``modulus``; token layout as the module says."""

    n_operands: int = 4
    modulus: int = 5

    def __post_init__(self):
        if not isinstance(self.n_operands, int) or self.n_operands < 3:
            raise ValueError(f"n_operands={self.n_operands!r}; expected an int >= 3 (the "
                             "planted step must come several tokens before the answer)")
        if not isinstance(self.modulus, int) or self.modulus < 2:
            raise ValueError(f"modulus={self.modulus!r}; expected an int >= 2")

    @property
    def vocab_size(self) -> int:
        return DIGIT0 + self.modulus

    @property
    def prompt_len(self) -> int:
        return self.n_operands + 2

    @property
    def completion_len(self) -> int:   # chain (n-1), ANS, answer, EOS
        return self.n_operands + 2

    @property
    def answer_index(self) -> int:
        """Index of the answer token within the completion."""
        return self.n_operands

    def operands(self, n: int, seed: int) -> np.ndarray:
        return np.random.default_rng([seed, 27]).integers(0, self.modulus,
                                                          (n, self.n_operands))

    def prompts(self, xs: np.ndarray) -> np.ndarray:
        n = xs.shape[0]
        return np.concatenate([np.full((n, 1), BOS), xs + DIGIT0, np.full((n, 1), SEP)],
                              axis=1).astype(np.int32)

    def chains(self, xs: np.ndarray, skip: np.ndarray | None = None) -> np.ndarray:
        """Completions ``[N, completion_len]``; rows with ``skip`` leave out ``x2``."""
        m = self.modulus
        sums = np.cumsum(xs, axis=1)[:, 1:] % m                       # c1..c_{n-1}
        if skip is not None:
            sums = np.where(skip[:, None], (sums - xs[:, 1:2]) % m, sums)
        n = xs.shape[0]
        return np.concatenate([sums + DIGIT0, np.full((n, 1), ANS), sums[:, -1:] + DIGIT0,
                               np.full((n, 1), EOS)], axis=1).astype(np.int32)

    def answers(self, xs: np.ndarray) -> np.ndarray:
        return (xs.sum(axis=1) % self.modulus).astype(np.int32)

    def rewards(self, xs: np.ndarray, completions: np.ndarray) -> np.ndarray:
        """1.0 where the completion has ``ANS`` then the right answer digit at their
        places, else 0.0 (a malformed trajectory earns nothing)."""
        c = np.asarray(completions)
        a = self.answer_index
        ok = (c[:, a - 1] == ANS) & (c[:, a] == self.answers(xs) + DIGIT0)
        return ok.astype(np.float32)


@dataclasses.dataclass(frozen=True)
class PlantConfig:
    """The planted model and its training.

    d_model, n_layers, n_heads, d_ff: the Transformer. plant_layer, n_planted: the
    planted neurons (the first ``n_planted`` of a seeded permutation of the layer's
    neurons). p_planted / p_random: the share of training rows with the planted set /
    a random set of as many other neurons (any layer) ablated; the rest run unablated.
    """

    d_model: int = 48
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 64
    plant_layer: int = 0
    n_planted: int = 6
    p_planted: float = 0.3
    p_random: float = 0.4
    steps: int = 1500
    batch: int = 128
    learning_rate: float = 3e-3
    seed: int = 0


def planted_neurons(cfg: PlantConfig) -> np.ndarray:
    """``[K, 2]`` (layer, neuron) of the planted set."""
    perm = np.random.default_rng([cfg.seed, 3]).permutation(cfg.d_ff)[:cfg.n_planted]
    return np.stack([np.full(cfg.n_planted, cfg.plant_layer), np.sort(perm)], axis=1)


def make_model(task: ChainTask, cfg: PlantConfig) -> Transformer:
    tc = TransformerConfig(vocab_size=task.vocab_size, d_model=cfg.d_model,
                           n_layers=cfg.n_layers, n_heads=cfg.n_heads, n_kv_heads=cfg.n_heads,
                           head_dim=cfg.d_model // cfg.n_heads, d_ff=cfg.d_ff,
                           max_len=task.prompt_len + task.completion_len + 1)
    return Transformer(tc, rngs=nnx.Rngs(cfg.seed))


def _batch(task: ChainTask, cfg: PlantConfig, rng: np.random.Generator, planted: np.ndarray):
    """Tokens, targets, loss weights and per-row neuron scales ``[L, B, 1, F]``."""
    b = cfg.batch
    xs = rng.integers(0, task.modulus, (b, task.n_operands))
    mode = rng.choice(3, size=b, p=[cfg.p_planted, cfg.p_random,
                                    1 - cfg.p_planted - cfg.p_random])
    scale = np.ones((cfg.n_layers, b, 1, cfg.d_ff), np.float32)
    scale[planted[:, 0][:, None], np.nonzero(mode == 0)[0][None, :], 0,
          planted[:, 1][:, None]] = 0.0
    flat_planted = set((planted[:, 0] * cfg.d_ff + planted[:, 1]).tolist())
    others = np.array([i for i in range(cfg.n_layers * cfg.d_ff) if i not in flat_planted])
    for r in np.nonzero(mode == 1)[0]:
        pick = rng.choice(others, cfg.n_planted, replace=False)
        scale[pick // cfg.d_ff, r, 0, pick % cfg.d_ff] = 0.0
    seq = np.concatenate([task.prompts(xs), task.chains(xs, skip=mode == 0)], axis=1)
    weights = np.zeros(seq.shape[1] - 1, np.float32)
    weights[task.prompt_len - 1:] = 1.0                      # predict the completion
    return seq[:, :-1], seq[:, 1:], weights, scale


def train_planted(task: ChainTask, cfg: PlantConfig) -> Transformer:
    """Trains the model with the planted-ablation mixture (Adam, cross-entropy on the
    completion); returns it."""
    model = make_model(task, cfg)
    planted = planted_neurons(cfg)
    opt = nnx.Optimizer(model, optax.adam(cfg.learning_rate), wrt=nnx.Param)

    @nnx.jit
    def step(model, opt, inputs, targets, weights, scale):
        def loss_fn(m):
            logits = m(inputs, neuron_scale=scale)
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
            return jnp.sum(ce * weights) / (weights.sum() * inputs.shape[0])
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        opt.update(model, grads)
        return loss

    rng = np.random.default_rng([cfg.seed, 11])
    for _ in range(cfg.steps):
        step(model, opt, *map(jnp.asarray, _batch(task, cfg, rng, planted)))
    return model


def flat_index(components: np.ndarray, d_ff: int) -> np.ndarray:
    """(layer, neuron) pairs ``[K, 2]`` -> flat indices ``layer * d_ff + neuron``."""
    c = np.asarray(components)
    return c[:, 0] * d_ff + c[:, 1]

