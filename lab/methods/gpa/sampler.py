"""Generative population annealing: annealed SMC from a frozen generator toward a reward tilt.

The target at inverse temperature ``beta`` is ``pi_beta(x) ∝ p(x) exp(beta r(x) / tau)``
with ``p`` the generator (prior) and ``r`` the oracle objective; ``beta`` goes
from 0 (the prior) to 1. Each round (Del Moral, Doucet & Jasra, 2006; blackjax's
``adaptive_tempered_smc``):

1. choose the next ``beta`` by bisection so that the conditional ESS of the
   incremental weights ``(beta' - beta) r / tau`` given the current weights is
   ``target_ess * N`` (:func:`smc.next_temperature`; Zhou, Johansen & Aston, 2016);
2. reweight; resample (``scheme``) when the accumulated weights' ESS falls
   below ``resample_threshold * N``;
3. mutate every particle ``mutation_steps`` times with a generator move
   (a span resampled anywhere for the AR model, re-mask-and-denoise for
   diffusion), accepted by Metropolis-Hastings
   ``alpha = min(1, exp(beta (r' - r) / tau + log_correction))`` (Hastings, 1970),
   which leaves ``pi_beta`` invariant.

The sampler is generic: it takes ``init(key, n)``, ``propose(key, x) ->
(x', log_correction)`` (``log_correction = log p(x') q(x|x') - log p(x) q(x'|x)``,
0 only when the move is an exact Gibbs draw from the prior's conditional) and
``reward(x)``, each jitted.
Every call of ``reward`` on ``n`` particles counts ``n`` oracle calls.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from lab.methods.gpa import smc


@dataclasses.dataclass(frozen=True)
class GPAConfig:
    num_particles: int = 512
    tau: float = 0.25  # reward scale: target p(x) exp(r / tau) at beta = 1
    target_ess: float = 0.5  # adaptive tempering keeps this conditional-ESS fraction per round
    resample_threshold: float = 0.5
    scheme: str = "systematic"
    mutation_steps: int = 2
    final_steps: int = 2  # extra mutation rounds at beta = 1
    mh: bool = True
    max_rounds: int = 60

    def __post_init__(self):
        if self.num_particles < 2:
            raise ValueError(f"num_particles={self.num_particles}; expected >= 2")
        if not 0 < self.target_ess < 1:
            raise ValueError(f"target_ess={self.target_ess}; expected in (0, 1)")
        if not 0 <= self.resample_threshold <= 1:
            raise ValueError(f"resample_threshold={self.resample_threshold}; expected in [0, 1]")
        if self.scheme not in smc.SCHEMES:
            raise ValueError(f"scheme={self.scheme!r}; expected one of {smc.SCHEMES}")
        if self.tau <= 0:
            raise ValueError(f"tau={self.tau}; expected > 0")


@dataclasses.dataclass
class Population:
    """The final particles, equally weighted, with the run's bookkeeping."""

    x: jax.Array
    reward: jax.Array
    oracle_calls: int
    history: list[dict]
    seconds: float


def mh_step(key, x, r, *, beta, tau, propose, reward, mh: bool = True):
    """One mutation of every particle: propose, score with the oracle, and accept by
    Metropolis-Hastings at inverse temperature ``beta`` (``mh=False`` accepts all).

    Returns ``(x, r, acceptance rate)``.
    """
    kp, ka = jax.random.split(key)
    x_new, log_corr = propose(kp, x)
    r_new = reward(x_new)
    if mh:
        log_alpha = beta * (r_new - r) / tau + log_corr
        accept = jnp.log(jax.random.uniform(ka, r.shape)) < log_alpha
    else:
        accept = jnp.ones(r.shape, bool)
    x = jnp.where(accept[:, None], x_new, x)
    r = jnp.where(accept, r_new, r)
    return x, r, jnp.mean(accept)


def gpa(key: jax.Array, init: Callable, propose: Callable, reward: Callable,
        config: GPAConfig) -> Population:
    """Runs GPA; returns the final population (resampled to equal weights)."""
    start = time.perf_counter()
    n, tau = config.num_particles, config.tau
    key, k0 = jax.random.split(key)
    x = init(k0, n)
    r = reward(x)
    calls = n
    beta = jnp.asarray(0.0, jnp.float32)
    lw = jnp.zeros((n,), jnp.float32)
    history = []

    def one_round(key, x, r, lw, beta, anneal: bool):
        nonlocal calls
        t0 = time.perf_counter()
        kb, kr = jax.random.split(key)
        if anneal:
            new_beta = smc.next_temperature(r / tau, beta, config.target_ess, log_weights=lw)
            lw = lw + (new_beta - beta) * r / tau
            beta = new_beta
        ess = float(smc.ess(lw))
        resampled = ess < config.resample_threshold * n
        if resampled:
            idx = smc.resample(kr, smc.normalize(lw), n, config.scheme)
            x, r, lw = x[idx], r[idx], jnp.zeros_like(lw)
        acc = []
        for _ in range(config.mutation_steps):
            kb, km = jax.random.split(kb)
            x, r, a = mh_step(km, x, r, beta=beta, tau=tau, propose=propose, reward=reward,
                              mh=config.mh)
            calls += n
            acc.append(float(a))
        history.append({"round": len(history) + 1, "beta": float(beta), "ess": ess,
                        "resampled": resampled,
                        "acceptance": float(np.mean(acc)) if acc else None,
                        "mean_reward": float(jnp.mean(r)), "oracle_calls": calls,
                        "seconds": time.perf_counter() - t0})
        return x, r, lw, beta

    while float(beta) < 1.0 and len(history) < config.max_rounds:
        key, k = jax.random.split(key)
        x, r, lw, beta = one_round(k, x, r, lw, beta, anneal=True)
    for _ in range(config.final_steps):
        key, k = jax.random.split(key)
        x, r, lw, beta = one_round(k, x, r, lw, beta, anneal=False)
    if float(jnp.max(lw) - jnp.min(lw)) > 0:  # equal weights for the returned population
        idx = smc.resample(key, smc.normalize(lw), n, config.scheme)
        x, r = x[idx], r[idx]
    return Population(x, r, calls, history, time.perf_counter() - start)
