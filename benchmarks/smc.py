"""SMC benchmark: GPA's particle-steps per second, and resampling throughput vs blackjax.

Prints, on this machine in one run:
  * resampling (systematic) draws/s of ``lab.methods.gpa.smc.resample`` against
    ``blackjax.smc.resampling.systematic`` on the same weights (target >= 1.0x);
  * the same for the other schemes (blackjax has all four);
  * particle-steps/s of one GPA mutation step (the AR span move: a span of 1..16 bases
    resampled anywhere with its suffix-likelihood correction, + oracle + MH) with a small
    random generator and oracle, over 256..4096 particles.

Run: python -m benchmarks.smc
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
from flax import nnx


def _time(fn, *args, reps=20):
    jax.block_until_ready(fn(*args))
    t = time.perf_counter()
    for _ in range(reps):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - t) / reps


def resampling(n: int = 100_000):
    from blackjax.smc import resampling as bj

    from lab.methods.gpa import smc

    w = jax.random.dirichlet(jax.random.key(0), jnp.ones(n))
    key = jax.random.key(1)
    print(f"resampling {n} particles (draws/s; higher is better)")
    for scheme in smc.SCHEMES:
        ours = jax.jit(lambda k, w, s=scheme: smc._FNS[s](k, w, n))
        ref = jax.jit(lambda k, w, s=scheme: getattr(bj, s)(k, w, n))
        t_ours, t_ref = _time(ours, key, w), _time(ref, key, w)
        print(f"  {scheme:12s} lab {n / t_ours:12.3e}  blackjax {n / t_ref:12.3e}  "
              f"ratio {t_ref / t_ours:5.2f}x")


def mutation(particles=(256, 512, 1024, 2048, 4096), length: int = 64):
    from lab.methods.gpa import generators, sampler
    from lab.methods.gpa.oracle import CNNOracle

    ar = generators.Transformer(generators.generator_config("ar", length), rngs=nnx.Rngs(0))
    oracle = CNNOracle(rngs=nnx.Rngs(1))
    og, os_ = nnx.split(oracle)
    reward = jax.jit(lambda x: nnx.merge(og, os_).predict(x))

    propose = generators.ar_span_proposal(ar, 16)
    print(f"GPA mutation step (AR span move + oracle + MH), L={length}")
    for n in particles:
        x = generators.ar_sample(ar, jax.random.key(0), n, length)[0]
        r = reward(x)
        step = lambda k, x=x, r=r: sampler.mh_step(k, x, r, beta=1.0, tau=0.25, propose=propose,
                                                reward=reward)
        t = _time(step, jax.random.key(2), reps=3)
        print(f"  {n:5d} particles: {n / t:10.1f} particle-steps/s ({t * 1e3:.1f} ms/step)")


if __name__ == "__main__":
    resampling()
    mutation()
