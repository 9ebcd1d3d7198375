"""GPA end to end: the world, the frozen generators and oracles, the moves, the metrics."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab.data import dna
from lab.methods.gpa import generators
from lab.methods.gpa.oracle import CNNOracle, train_oracle
from lab.methods.gpa.sampler import Population
from lab.nn import Transformer
from lab.train import TrainConfig

OBJECTIVES = ("activity", "specificity", "fidelity")
HELD_OUT_K = 4  # k of the held-out k-mer spectrum (k-mers outside the motifs' consensus)


# Training hyperparameters of the frozen models (part of the bundle's recipe, so that
# changing one retrains instead of loading stale weights).
LEARNING_RATE, WARMUP_STEPS, ORACLE_WIDTH, AUDIT_WIDTH = 3e-3, 20, 32, 64
RICH_PLANT_PROB = 0.7  # motif density of the oracles' enriched training sequences
ASSETS = "gpa-assets"  # the bundle's name (lab.zoo.bundle)


@dataclasses.dataclass
class Assets:
    """Everything frozen that the samplers share; ``seconds``: each part's training time
    (recorded when the bundle was trained), ``source``: where the trained models came from
    (``"shipped"``, ``"cached"`` or ``"trained"``, :mod:`lab.zoo.bundle`)."""

    world: dna.DNAWorld
    train_seqs: np.ndarray
    ar: nnx.Module
    diffusion: nnx.Module
    oracle_a: CNNOracle
    oracle_b: CNNOracle
    audit_a: CNNOracle
    seconds: dict
    source: str = "trained"


def _sha(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def build_assets(*, seed: int, seq_len: int, n_train: int, generator_steps: int,
                 oracle_steps: int, d_model: int = 64, n_layers: int = 2,
                 source: str | None = None) -> Assets:
    """Samples the world's data, and loads the generators and oracles trained on it.

    The trained models are a :mod:`lab.zoo.bundle` keyed by their recipe (these arguments,
    the training hyperparameters and a hash of the training sequences, integers, so that a
    changed generator of the data retrains too while float rounding of the measured
    targets, which varies by host, does not change the key): shipped with Lab, cached on
    this host, or trained now (timed per part). ``source`` as :func:`lab.zoo.bundle.load`
    takes it.
    """
    from lab.zoo import bundle

    world = dna.make_world(seed, seq_len=seq_len)
    k1, k2, k3, k4 = jax.random.split(jax.random.key(seed), 4)
    seqs = np.asarray(dna.sample(world, k1, n_train))
    # Oracles see noisy measurements; the audit oracle is wider and trained on a disjoint split.
    half = n_train // 2
    act = np.asarray(dna.activity(world, jnp.asarray(seqs)))
    meas = act + world.noise * np.asarray(jax.random.normal(k2, act.shape))
    # Enrich the oracle's training set with designs-like sequences (motifs planted densely),
    # so that the oracle has seen the high-activity region it will be asked about.
    rich_world = dataclasses.replace(world, plant_prob=RICH_PLANT_PROB)
    rich = np.asarray(dna.sample(rich_world, k3, n_train // 2))
    rich_act = np.asarray(dna.activity(world, jnp.asarray(rich)))
    rich_meas = rich_act + world.noise * np.asarray(jax.random.normal(k4, rich_act.shape))
    xs = np.concatenate([seqs[:half], rich[: len(rich) // 2]])
    ys = np.concatenate([meas[:half], rich_meas[: len(rich) // 2]])
    xa = np.concatenate([seqs[half:], rich[len(rich) // 2:]])
    ya = np.concatenate([meas[half:], rich_meas[len(rich) // 2:]])
    model_kw = {"d_model": d_model, "n_layers": n_layers}

    def cfg(steps, s):
        return TrainConfig(steps=steps, learning_rate=LEARNING_RATE,
                           warmup_steps=WARMUP_STEPS, seed=s, progress=False,
                           log_every=max(steps, 1))

    def train():
        times, models = {}, {}
        for name, fn in (("ar", generators.train_ar), ("diffusion", generators.train_diffusion)):
            t = time.perf_counter()
            models[name] = fn(seqs, cfg(generator_steps, seed), **model_kw)
            times[f"{name}_generator"] = time.perf_counter() - t
        t = time.perf_counter()
        models["oracle_a"] = train_oracle(xs, ys[:, 0], cfg(oracle_steps, seed + 1),
                                          width=ORACLE_WIDTH)
        models["oracle_b"] = train_oracle(xs, ys[:, 1], cfg(oracle_steps, seed + 2),
                                          width=ORACLE_WIDTH)
        models["audit_a"] = train_oracle(xa, ya[:, 0], cfg(oracle_steps, seed + 3),
                                         width=AUDIT_WIDTH)
        times["oracles"] = time.perf_counter() - t
        return models, {"seconds": times}

    def template():
        rngs = nnx.Rngs(0)
        return {"ar": Transformer(generators.generator_config("ar", seq_len, **model_kw),
                                  rngs=rngs),
                "diffusion": Transformer(generators.generator_config("diffusion", seq_len,
                                                                     **model_kw), rngs=rngs),
                "oracle_a": CNNOracle(width=ORACLE_WIDTH, rngs=rngs),
                "oracle_b": CNNOracle(width=ORACLE_WIDTH, rngs=rngs),
                "audit_a": CNNOracle(width=AUDIT_WIDTH, rngs=rngs)}

    recipe = {"seed": seed, "seq_len": seq_len, "n_train": n_train,
              "generator_steps": generator_steps, "oracle_steps": oracle_steps, **model_kw,
              "learning_rate": LEARNING_RATE, "warmup_steps": WARMUP_STEPS,
              "oracle_width": ORACLE_WIDTH, "audit_width": AUDIT_WIDTH,
              "sequences_sha256": _sha(seqs, xs, xa)}
    got = bundle.load(ASSETS, recipe, train, template, source=source)
    m = got.modules
    return Assets(world, seqs, m["ar"], m["diffusion"], m["oracle_a"], m["oracle_b"],
                  m["audit_a"], got.metrics["seconds"], source=got.source)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _apply(graphdef, method: str, state, x):
    return getattr(nnx.merge(graphdef, state), method)(x)


def _pure(module: nnx.Module, method: str = "__call__"):
    """``f(x)``: ``module.method(x)`` jitted with the state as an argument (not a baked-in
    constant), so every module of one structure shares a compiled program per shape."""
    graphdef, state = nnx.split(module)
    return functools.partial(_apply, graphdef, method, state)


def objective(assets: Assets, kind: str, *, fidelity_weight: float = 0.5):
    """The reward ``r(x)`` of a design objective on int sequences ``[n, L]`` (jitted parts).

    activity: oracle A; specificity: oracle A - oracle B; fidelity: oracle A plus
    ``fidelity_weight`` times the AR prior's mean per-base log-likelihood above the
    training sequences' mean (penalises designs that leave the natural distribution).
    """
    if kind not in OBJECTIVES:
        raise ValueError(f"objective={kind!r}; expected one of {OBJECTIVES}")
    a, b = _pure(assets.oracle_a, "predict"), _pure(assets.oracle_b, "predict")
    if kind == "activity":
        return a
    if kind == "specificity":
        return lambda x: a(x) - b(x)
    ll = prior_loglik(assets)
    base = float(jnp.mean(ll(jnp.asarray(assets.train_seqs[:512])))) / assets.world.seq_len
    return lambda x: a(x) + fidelity_weight * (ll(x) / x.shape[1] - base)


def onehot_objective(assets: Assets, kind: str):
    """The differentiable oracle part on relaxed one-hot input (gradient editing)."""
    if kind == "specificity":
        return lambda s: assets.oracle_a(s) - assets.oracle_b(s)
    return lambda s: assets.oracle_a(s)


@functools.partial(jax.jit, static_argnums=0)
def _loglik(graphdef, state, x):
    return generators.ar_loglik(nnx.merge(graphdef, state), x)


def ar_loglik_fn(ar: nnx.Module):
    """``f(x)``: ``generators.ar_loglik(ar, x)`` jitted with the weights as an argument."""
    graphdef, state = nnx.split(ar)
    return functools.partial(_loglik, graphdef, state)


def prior_loglik(assets: Assets):
    """``f(x)``: the AR prior's log-likelihood of each sequence (one compiled program)."""
    return ar_loglik_fn(assets.ar)


def ar_moves(assets: Assets, span_max: int):
    """``init`` (prior samples) and ``propose`` (:func:`generators.ar_span_proposal`: a span
    of ``1..span_max`` bases resampled anywhere, with the suffix-likelihood MH correction)
    for the AR generator."""
    length = assets.world.seq_len

    def init(key, n):
        return generators.ar_sample(assets.ar, key, n, length)[0]

    return init, generators.ar_span_proposal(assets.ar, span_max)


def diffusion_moves(assets: Assets, n_mask: int, sample_steps: int):
    """``init`` (the diffusion model's ancestral samples) and ``propose`` (re-mask
    ``n_mask`` bases and refill them from the denoiser, :func:`generators.diffusion_proposal`)
    for the diffusion generator.

    The diffusion model has no tractable likelihood, so the target's prior density is the
    AR model's exact likelihood (both are fitted to the same sequences); the MH ratio
    carries that density ratio and the denoiser's proposal ratio, so each move leaves the
    tempered target exactly invariant. The first population is the diffusion model's
    samples, an approximation of that prior at ``beta = 0``.
    """
    length = assets.world.seq_len

    def init(key, n):
        return generators.diffusion_sample(assets.diffusion, key, n, length, sample_steps)

    return init, generators.diffusion_proposal(assets.diffusion, n_mask, prior_loglik(assets))


_TRUTH: dict = {}


def _truth(world: dna.DNAWorld):
    """``f(x) -> (dna.activity, motif strengths)`` jitted for ``world`` (built once)."""
    if id(world) not in _TRUTH:
        _TRUTH[id(world)] = (world, jax.jit(
            lambda x: (dna.activity(world, x), dna.motif_strength(world, x)[0])))
    return _TRUTH[id(world)][1]


def metrics(assets: Assets, pop: Population, reward_fn, top_frac: float = 0.1) -> dict:
    """Design metrics of a population: oracle objective (mean, top ``top_frac``), true and
    audit-oracle activity, motif fidelity, prior log-likelihood per base, diversity, 3-mer
    Jensen-Shannon divergence to the training data, the same on the held-out 4-mers (every
    4-mer that is not in a motif's consensus, so a statistic the oracles do not reward),
    the longest homopolymer (mean and its standard error), oracle calls (the axes of the
    GPA abstract: activity, specificity, fidelity, diversity, reward hacking)."""
    x = jnp.asarray(pop.x, jnp.int32)
    world = assets.world
    r = np.asarray(reward_fn(x))
    true, m = (np.asarray(v) for v in _truth(world)(x))
    audit = np.asarray(_pure(assets.audit_a, "predict")(x))
    k = max(1, int(top_frac * len(r)))
    ll = np.asarray(prior_loglik(assets)(x)) / world.seq_len
    train_spec = dna.kmer_spectrum(assets.train_seqs, 3)
    held_out = dna.motif_kmers(world, HELD_OUT_K)
    hp = dna.max_homopolymer(np.asarray(x))
    return {
        "objective_mean": float(r.mean()),
        "objective_top10": float(np.sort(r)[-k:].mean()),
        "true_activity_a": float(true[:, 0].mean()),
        "true_specificity": float((true[:, 0] - true[:, 1]).mean()),
        "audit_activity_a": float(audit.mean()),
        "motif_fidelity": float(((m[:, 0] > 0.5) & (m[:, 1] > 0.5)).mean()),
        "prior_loglik_per_base": float(ll.mean()),
        "diversity": dna.mean_pairwise_hamming(np.asarray(x)),
        "kmer_js": dna.js_divergence(dna.kmer_spectrum(np.asarray(x), 3), train_spec),
        "heldout_kmer_js": dna.js_divergence(
            dna.kmer_spectrum(np.asarray(x), HELD_OUT_K, held_out),
            dna.kmer_spectrum(assets.train_seqs, HELD_OUT_K, held_out)),
        "max_homopolymer": float(hp.mean()),
        "max_homopolymer_se": float(hp.std(ddof=1) / np.sqrt(len(hp))) if len(hp) > 1 else 0.0,
        "oracle_calls": pop.oracle_calls,
        "seconds": pop.seconds,
    }
