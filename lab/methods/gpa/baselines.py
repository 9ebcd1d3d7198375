"""The samplers GPA is compared with, each spending a stated number of oracle calls.

* best-of-N: ``budget`` prior samples, keep the ``n_out`` with the highest reward.
* reward-weighted resampling: ``budget`` prior samples, resample ``n_out`` with
  weights ``exp(r / tau)`` (one-shot importance resampling to the same target
  GPA anneals to).
* simulated annealing: ``n_out`` chains of point mutations accepted by
  ``exp((Δr / tau + Δlog p) / T)``, ``T`` decreasing geometrically to 1, so the
  chains end on the same target; ``budget / n_out`` steps.
* gradient-based editing: relaxed one-hot logits optimised by Adam on
  ``r(softmax) / tau + log p(softmax)`` (the AR prior read through
  ``inputs_embeds``), then rounded; each gradient step costs one oracle call per
  sequence.
* tree search over denoising steps (beam search guided by the oracle, after tree-search
  guidance for discrete diffusion): from
  ``n_out`` all-MASK beams, each ancestral denoising step expands every beam into
  ``branch`` children, scores each child by the oracle on its predicted clean sequence
  (the denoiser's argmax at the masked positions), and keeps the ``n_out`` best children
  (value-guided decoding of discrete diffusion as in SVDD, Li et al., 2024, with a global
  beam in place of per-sample selection);
  ``steps * n_out * branch`` oracle calls.
* RL fine-tuning: the AR generator trained with :func:`lab.train.policy_gradient_loss`
  (group-normalised advantages, k3 KL to the frozen prior), then sampled; every
  sampled sequence scored during training costs one oracle call.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from lab.methods.gpa import generators, smc
from lab.methods.gpa.sampler import Population
from lab.train import group_advantages, policy_gradient_loss


def _pop(x, r, calls, start, history=None):
    return Population(x, r, int(calls), history or [], time.perf_counter() - start)


def _chunked(init: Callable, key, n: int, chunk: int):
    """``n`` samples drawn ``chunk`` at a time (one compiled sampler shape; the last chunk's
    surplus is dropped, unscored)."""
    keys = jax.random.split(key, -(-n // chunk))
    return jnp.concatenate([init(k, chunk) for k in keys])[:n]


def best_of_n(key, init: Callable, reward: Callable, budget: int, n_out: int) -> Population:
    start = time.perf_counter()
    x = _chunked(init, key, budget, n_out)
    r = reward(x)
    top = jnp.argsort(-r)[:n_out]
    return _pop(x[top], r[top], budget, start)


def reward_weighted(key, init: Callable, reward: Callable, budget: int, n_out: int,
                    tau: float) -> Population:
    start = time.perf_counter()
    k1, k2 = jax.random.split(key)
    x = _chunked(init, k1, budget, n_out)
    r = reward(x)
    idx = smc.resample(k2, smc.normalize(r / tau), n_out, "systematic")
    return _pop(x[idx], r[idx], budget, start)


def simulated_annealing(key, init: Callable, reward: Callable, prior_logp: Callable,
                        budget: int, n_out: int, tau: float, t_start: float = 10.0) -> Population:
    start = time.perf_counter()
    steps = max(1, budget // n_out - 1)
    k0, key = jax.random.split(key)
    x = init(k0, n_out)
    r, lp = reward(x), prior_logp(x)
    temps = t_start ** (1.0 - jnp.arange(steps) / max(steps - 1, 1))

    @jax.jit
    def propose(k, x):
        kp, kb = jax.random.split(k)
        pos = jax.random.randint(kp, (x.shape[0], 1), 0, x.shape[1])
        base = (x[jnp.arange(x.shape[0])[:, None], pos] +
                jax.random.randint(kb, (x.shape[0], 1), 1, 4)) % 4
        return jnp.where(jnp.arange(x.shape[1])[None] == pos, base, x)

    for t in temps:
        key, kp, ka = jax.random.split(key, 3)
        x_new = propose(kp, x)
        r_new, lp_new = reward(x_new), prior_logp(x_new)
        log_alpha = ((r_new - r) / tau + (lp_new - lp)) / t
        acc = jnp.log(jax.random.uniform(ka, r.shape)) < log_alpha
        x = jnp.where(acc[:, None], x_new, x)
        r, lp = jnp.where(acc, r_new, r), jnp.where(acc, lp_new, lp)
    return _pop(x, r, n_out * (steps + 1), start)


def gradient_editing(key, init: Callable, oracle_onehot: Callable, prior: nnx.Module,
                     reward: Callable, budget: int, n_out: int, tau: float,
                     lr: float = 0.1) -> Population:
    """``oracle_onehot(relaxed [n, L, 4]) -> [n]`` must be differentiable."""
    start = time.perf_counter()
    steps = max(1, budget // n_out - 1)
    x0 = init(key, n_out)
    logits = 3.0 * jax.nn.one_hot(x0, 4)
    graphdef, state = nnx.split(prior)

    def objective(theta):
        soft = jax.nn.softmax(theta, -1)
        model = nnx.merge(graphdef, state)
        emb = model.embed.embedding[...]
        bos = jnp.broadcast_to(emb[generators.SPECIAL], (soft.shape[0], 1, emb.shape[1]))
        inputs = jnp.concatenate([bos, soft[:, :-1] @ emb[:4]], 1)
        logp = jax.nn.log_softmax(model(inputs_embeds=inputs)[..., :4])
        prior_ll = jnp.sum(soft * logp, axis=(1, 2))
        return -jnp.sum(oracle_onehot(soft) / tau + prior_ll)

    tx = optax.adam(lr)
    opt = tx.init(logits)

    @jax.jit
    def step(theta, opt):
        g = jax.grad(objective)(theta)
        upd, opt = tx.update(g, opt)
        return optax.apply_updates(theta, upd), opt

    for _ in range(steps):
        logits, opt = step(logits, opt)
    x = jnp.argmax(logits, -1).astype(jnp.int32)
    return _pop(x, reward(x), n_out * (steps + 1), start)


@functools.partial(jax.jit, static_argnums=(0, 5))
def _expand(graphdef, state, key, z, t_s, branch: int):
    """``branch`` ancestral children of every beam ``z`` at the step ``t -> s``, and each
    child's predicted clean sequence (the denoiser's argmax at its still-masked bases)."""
    model = nnx.merge(graphdef, state)
    t, s = t_s[0], t_s[1]
    z = jnp.repeat(z, branch, axis=0)
    ks, ku = jax.random.split(key)
    logp = generators.denoise_logp(model, z)
    fill = jax.random.categorical(ks, logp)
    reveal = (z == generators.SPECIAL) & (jax.random.uniform(ku, z.shape) < (t - s) / t)
    child = jnp.where(reveal, fill, z)
    pred = jnp.argmax(generators.denoise_logp(model, child), -1).astype(jnp.int32)
    return child, jnp.where(child == generators.SPECIAL, pred, child)


def diffusion_tree_search(key, model: nnx.Module, reward: Callable, budget: int, n_out: int,
                          length: int, max_steps: int) -> Population:
    """Oracle-guided beam search over the diffusion model's denoising steps (see the module
    docstring). The budget sets the tree: ``steps`` denoising steps (at most
    ``max_steps``) with 2 children per beam, ``steps = round((budget - n_out) / (2 n_out))``,
    and when ``max_steps`` steps leave budget over, more children per beam, so the calls
    (``steps * n_out * branch`` plus ``n_out`` for the final designs) match ``budget`` to
    within one step's."""
    start = time.perf_counter()
    spend = max(budget - n_out, 2 * n_out)
    steps = int(min(max_steps, max(1, round(spend / (2 * n_out)))))
    branch = max(2, round(spend / (steps * n_out)))
    graphdef, state = nnx.split(model)
    z = jnp.full((n_out, length), generators.SPECIAL, jnp.int32)
    ts = jnp.linspace(1.0, 0.0, steps + 1)
    calls = 0
    for i in range(steps):
        key, k = jax.random.split(key)
        child, pred = _expand(graphdef, state, k, z, ts[i:i + 2], branch)
        score = reward(pred)
        calls += child.shape[0]
        top = jnp.argsort(-score)[:n_out]
        z = child[top]
    x = jnp.where(z == generators.SPECIAL, 0, z)  # every base is revealed at s = 0
    return _pop(x, reward(x), calls + n_out, start)


@dataclasses.dataclass(frozen=True)
class RLConfig:
    group: int = 128
    learning_rate: float = 1e-4
    kl_coef: float = 0.05
    clip_eps: float = 0.2


def rl_finetune(key, prior: nnx.Module, reward: Callable, budget: int, n_out: int,
                length: int, config: RLConfig = RLConfig()) -> Population:
    """GRPO-style fine-tuning of a copy of the AR prior, then ``n_out`` samples from it."""
    start = time.perf_counter()
    steps = max(1, (budget - n_out) // config.group)
    policy = nnx.clone(prior)
    ref_graph, ref_state = nnx.split(prior)
    opt = nnx.Optimizer(policy, optax.adam(config.learning_rate), wrt=nnx.Param)

    @nnx.jit
    def update(policy, opt, x, adv):
        ref = nnx.merge(ref_graph, ref_state)
        batch = generators.ar_batch(x)
        ref_lp = jax.lax.stop_gradient(_token_logp(ref, batch))

        def loss_fn(policy):
            lp = _token_logp(policy, batch)
            return policy_gradient_loss(lp, None, ref_lp, adv, batch["mask"],
                                        clip_eps=config.clip_eps, kl_coef=config.kl_coef)[0]

        loss, grads = nnx.value_and_grad(loss_fn)(policy)
        opt.update(policy, grads)
        return loss

    history = []
    for s in range(steps):
        key, ks = jax.random.split(key)
        x, _ = generators.ar_sample(policy, ks, config.group, length)
        r = reward(x)
        adv = group_advantages(r, jnp.zeros_like(r, jnp.int32))
        update(policy, opt, x, adv)
        history.append({"step": s, "mean_reward": float(r.mean())})
    x, _ = generators.ar_sample(policy, key, n_out, length)
    return _pop(x, reward(x), steps * config.group + n_out, start, history)


def _token_logp(model, batch):
    logp = jax.nn.log_softmax(model(batch["inputs"])[..., :4])
    return jnp.take_along_axis(logp, batch["targets"][..., None], -1)[..., 0]
