"""The measurements of the experiment, as functions of plain arguments (usable from a notebook).

* :func:`construction_dims`: smallest dimension at which the closed-form
  construction recalls ``target`` of the facts, per ``N``.
* :func:`train_dims`: the same for gradient-descent training (bisection over a
  grid; every model of one ``N`` is zero-padded to the grid's largest width so
  that the search compiles once per ``N``).
* :func:`probe_and_transfer`: superposition R^2, relation gating, zero-shot
  transfer to new bijections, on a trained model.
* :func:`multihop`: two-hop chains with and without chain-of-thought, both for
  the construction (any number of hops) and for training.
"""

from __future__ import annotations

import time

import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab.methods.geomem import capacity, construction, data, probes, training
from lab.methods.geomem.model import OneLayer, accuracy, capture, predict


def construction_dims(ns, n_relations: int, m_grid, *, hops: int = 1, cot: bool = False,
                      target: float = 0.99, seed: int = 0) -> list[dict]:
    """Rows ``{"n", "m", "d", "accuracy_at": {m: acc}}``: smallest subject dim ``m`` and
    model width ``d = m + hops*R`` at which the construction reaches ``target``."""
    rows = []
    for n in ns:
        perms = data.bijections(seed, n, n_relations)
        if cot:
            def evaluate(m, perms=perms):
                return construction.cot_accuracy(seed, perms, m, hops)
            extra = n_relations  # the one-hop model's relation dims
        else:
            def evaluate(m, perms=perms):
                return construction.accuracy(seed, perms, m, hops)
            extra = hops * n_relations
        m_star, seen = capacity.smallest_dim(evaluate, m_grid, target)
        rows.append({"n": n, "m": m_star, "d": None if m_star is None else m_star + extra,
                     "accuracy_at": seen})
    return rows


def _train_one(n, perms, hops, d, hidden_mult, width, fit_cfg, seed):
    tokens, answers, _ = data.queries(perms, hops)
    r = perms.shape[0]
    model = OneLayer(n, hops * r, d, hidden_mult * d, rngs=nnx.Rngs(seed), width=width,
                     hidden_width=hidden_mult * width)
    stats = training.fit(model, tokens, answers, fit_cfg)
    return model, stats


def train_dims(ns, n_relations: int, d_grid, fit_cfg: training.FitConfig, *,
               hidden_mult: int = 4, seed: int = 0, progress=None) -> tuple[list[dict], dict]:
    """Smallest trained width reaching ``fit_cfg.target`` per ``N`` (bisection over ``d_grid``).

    Returns:
      rows ``{"n", "d", "accuracy_at": {d: acc}, "steps_at", "seconds"}`` and
      ``{n: (model, perms)}``: the passing model at ``d`` (the widest tried where
      none passed) and its bijections.
    """
    rows, models = [], {}
    width = max(d_grid)
    for n in ns:
        t0 = time.time()
        perms = data.bijections(seed, n, n_relations)
        trained, steps = {}, {}

        def evaluate(d, n=n, perms=perms, trained=trained, steps=steps):
            model, stats = _train_one(n, perms, 1, d, hidden_mult, width, fit_cfg, seed)
            trained[d], steps[d] = model, stats["steps"]
            if progress is not None:
                progress(f"GD N={n} d={d}: accuracy {stats['accuracy']:.4f} "
                         f"after {stats['steps']} steps")
            return stats["accuracy"]

        d_star, seen = capacity.smallest_dim(evaluate, d_grid, fit_cfg.target)
        # The passing model, or the widest one tried when none passed.
        models[n] = (trained[d_star if d_star is not None else max(trained)], perms)
        rows.append({"n": n, "d": d_star, "accuracy_at": seen, "steps_at": steps,
                     "seconds": time.time() - t0})
    return rows, models


def _unpadded(model: OneLayer):
    d = model.d
    return (np.asarray(model.subjects[...])[:, :d], np.asarray(model.unembed[...])[:, :d])


def train_probe_model(n: int, n_relations: int, d: int, fit_cfg: training.FitConfig, *,
                      hidden_mult: int = 4, seed: int = 0, width: int | None = None
                      ) -> tuple[OneLayer, object, dict]:
    """A one-hop model trained at width ``d`` (zero-padded to ``width``) for
    ``fit_cfg.steps``; with ``target=None`` there is no early stop, so this is the
    converged solution the probes look at. Returns ``(model, perms, stats)``."""
    perms = data.bijections(seed, n, n_relations)
    model, stats = _train_one(n, perms, 1, d, hidden_mult, max(d, width or d), fit_cfg, seed)
    return model, perms, stats


def probe_and_transfer(model: OneLayer, perms, fit_cfg: training.FitConfig, *,
                       transfer_steps: int, hidden_mult: int, seed: int = 0,
                       refit: bool = True) -> dict:
    """Probes a trained one-hop model and transfers its MLP to new bijections.

    Measures: held-out superposition R^2 of the trained subject embeddings (and of
    a random table of the same shape, and of the closed-form construction);
    relation selectivity of MLP units; zero-shot
    accuracy on new bijections when subject embeddings are rebuilt by the fitted
    superposition rule ``e'_s = sum_r W_r u_{pi'_r(s)} + b`` with every other
    weight kept. Only when ``refit`` (two more trainings): gating of the model at
    initialisation and of the construction, and accuracy after fitting only fresh
    subject embeddings for ``transfer_steps`` steps through the frozen trained
    network vs a frozen random one.
    """
    r, n = perms.shape
    tokens, answers, _ = data.queries(perms, 1)
    rel = np.repeat(np.arange(r), n)
    emb, codes = _unpadded(model)
    d = model.d
    out = {"d": d}
    out["superposition"] = probes.superposition_r2(emb, codes, perms, seed=seed)
    rng = np.random.default_rng(seed)
    out["superposition_random"] = probes.superposition_r2(
        rng.normal(size=emb.shape), codes, perms, seed=seed)
    cons = construction.construct(seed, perms, d, 1)
    out["superposition_construction"] = probes.superposition_r2(
        cons.embeddings, cons.codes, perms, seed=seed)

    _, cap = capture(model, tokens)
    out["gating"] = probes.gating_selectivity(cap["z"], rel, r)
    new_perms = data.bijections(seed + 10_000, n, r)
    new_tokens, new_answers, _ = data.queries(new_perms, 1)
    coef = probes.fit_superposition(emb, codes, perms)
    new_emb = probes.superposition_features(codes, new_perms) @ coef
    moved = nnx.clone(model)
    table = np.zeros(moved.subjects.shape, np.float32)
    table[:, :d] = new_emb
    moved.subjects[...] = jnp.asarray(table)
    out["zero_shot_accuracy"] = accuracy(moved, new_tokens, new_answers)
    out["accuracy_before_transfer"] = accuracy(model, tokens, answers)
    if not refit:
        return out
    width = model.subjects.shape[1]
    init = OneLayer(n, r, d, hidden_mult * d, rngs=nnx.Rngs(seed + 1), width=width,
                    hidden_width=model.w1.shape[1])
    _, cap0 = capture(init, tokens)
    out["gating_init"] = probes.gating_selectivity(cap0["z"], rel, r)
    cmodel = construction.to_model(cons, 1)
    _, capc = capture(cmodel, tokens)
    out["gating_construction"] = probes.gating_selectivity(capc["z"], rel, r)

    # Fit only the new subject embeddings: trained network frozen vs a random one.
    short = training.FitConfig(steps=transfer_steps, learning_rate=fit_cfg.learning_rate,
                               batch_size=fit_cfg.batch_size, segment=min(fit_cfg.segment,
                                                                          transfer_steps),
                               target=None, seed=seed)
    for name, base in (("trained", model), ("random", init)):
        m = nnx.clone(base)
        fresh = OneLayer(n, r, d, hidden_mult * d, rngs=nnx.Rngs(seed + 2), width=width,
                         hidden_width=model.w1.shape[1])
        m.subjects[...] = fresh.subjects[...]
        stats = training.fit(m, new_tokens, new_answers, short, only="subjects")
        out[f"refit_subjects_{name}_network"] = stats["accuracy"]
    return out


def multihop(n: int, n_relations: int, d_grid, fit_cfg: training.FitConfig, *,
             hidden_mult: int = 4, seed: int = 0, progress=None,
             width: int | None = None) -> list[dict]:
    """Two-hop accuracy vs width for training: without CoT (a model trained on the
    ``R^2`` two-hop queries) and with CoT (a one-hop model of the same width applied
    twice, the intermediate entity emitted and fed back as the subject)."""
    perms = data.bijections(seed + 7, n, n_relations)
    tokens2, answers2, chain_list = data.queries(perms, 2)
    width = max(max(d_grid), width or 0)
    rows = []
    for d in d_grid:
        one, stats1 = _train_one(n, perms, 1, d, hidden_mult, width, fit_cfg, seed)
        pred = predict(one, data.queries(perms, 1)[0]).reshape(n_relations, n)
        cot = float(np.mean(data.compose(pred, chain_list).reshape(-1) == answers2))
        two, stats2 = _train_one(n, perms, 2, d, hidden_mult, width, fit_cfg, seed)
        rows.append({"d": d, "one_hop": stats1["accuracy"], "two_hop_cot": cot,
                     "two_hop_no_cot": stats2["accuracy"]})
        if progress is not None:
            progress(f"multi-hop d={d}: CoT {cot:.4f}, no CoT {stats2['accuracy']:.4f}")
    return rows
