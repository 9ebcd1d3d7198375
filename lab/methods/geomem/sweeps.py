"""The measurements of the experiment, as functions of plain arguments (usable from a notebook).

* :func:`construction_dims`: smallest dimension at which the closed-form
  construction recalls ``target`` of the facts, per ``N``.
* :func:`train_dims`: the same for gradient-descent training (bisection over a
  grid; every model of one ``N`` is zero-padded to the grid's largest width so
  that the search compiles once per ``N``).
* :func:`probe_and_transfer`: superposition R^2, relation gating, zero-shot
  transfer to new bijections, on a trained model.
* :func:`multihop`: multi-hop chains under training, one pass vs chain-of-thought in
  the model (it reads its own emitted intermediate answers, :func:`cot_generate`).
"""

from __future__ import annotations

import dataclasses
import time

import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab.methods.geomem import capacity, construction, data, probes, training
from lab.methods.geomem.model import OneLayer, accuracy, capture, predict


def construction_dims(ns, n_relations: int, m_grid, *, hops: int = 1, cot: bool = False,
                      target: float = 0.99, seed: int = 0, seeds: int = 1) -> list[dict]:
    """Rows ``{"n", "m", "d", "accuracy_at": {m: acc}}``: smallest subject dim ``m`` and
    model width ``d = m + hops*R`` at which the construction reaches ``target``.

    The accuracy at each ``m`` is the mean over ``seeds`` independent draws (bijections,
    codes and bindings from seeds ``seed .. seed + seeds - 1``): the construction's expected
    accuracy, whose single draws wobble by a few facts at small ``N``."""
    if not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds={seeds!r}; expected a positive int")
    rows = []
    for n in ns:
        draws = [(s, data.bijections(s, n, n_relations)) for s in range(seed, seed + seeds)]
        if cot:
            def evaluate(m, draws=draws):
                return float(np.mean([construction.cot_accuracy(s, p, m, hops)
                                      for s, p in draws]))
            extra = n_relations  # the one-hop model's relation dims
        else:
            def evaluate(m, draws=draws):
                return float(np.mean([construction.accuracy(s, p, m, hops) for s, p in draws]))
            extra = hops * n_relations
        m_star, seen = capacity.smallest_dim(evaluate, m_grid, target)
        rows.append({"n": n, "m": m_star, "d": None if m_star is None else m_star + extra,
                     "accuracy_at": seen})
    return rows


def _train_one(n, perms, hops, d, hidden_mult, width, fit_cfg, seed):
    tokens, answers, _ = data.queries(perms, hops)
    return _train_tokens(n, tokens, answers, hops * perms.shape[0], d, hidden_mult, width,
                         fit_cfg, seed)


def train_dims(ns, n_relations: int, d_grid, fit_cfg: training.FitConfig, *,
               hidden_mult: int = 4, seed: int = 0, progress=None) -> tuple[list[dict], dict]:
    """Smallest trained width reaching ``fit_cfg.target`` per ``N`` (ascending).

    The smallest ``N`` bisects ``d_grid``; each next one walks from the previous answer
    (:func:`capacity.smallest_dim` with ``start``): a run that misses trains for every
    step, so the two-evaluation walk is what keeps five or more ``N`` affordable.

    Returns:
      rows ``{"n", "d", "accuracy_at": {d: acc}, "steps_at", "seconds"}`` and
      ``{n: (model, perms)}``: the passing model at ``d`` (the widest tried where
      none passed) and its bijections.
    """
    rows, models = [], {}
    width, start = max(d_grid), None
    for n in sorted(ns):
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

        d_star, seen = capacity.smallest_dim(evaluate, d_grid, fit_cfg.target, start=start)
        start = d_star  # the next (larger) N starts its walk here
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
    weight kept, beside the control of a random subject table of the same scale
    (``random_table_accuracy``, near chance ``1/N`` unless the network answers without
    the subject). Only when ``refit`` (two more trainings): gating of the model at
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
    # Control: the same network with a random subject table of the trained one's scale.
    table[:, :d] = rng.normal(size=(n, d)) * float(np.std(emb))
    moved.subjects[...] = jnp.asarray(table)
    out["random_table_accuracy"] = accuracy(moved, new_tokens, new_answers)
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


def cot_generate(model: OneLayer, perms, hops: int) -> np.ndarray:
    """Chain-of-thought generation by ``model`` on every ``hops``-hop query.

    Step ``k`` reads the query and the model's own emissions ``e_1..e_k`` (errors
    included; :func:`~lab.methods.geomem.data.cot_steps` layout) and emits ``e_{k+1}``.
    Returns the emissions ``[hops, C*N]``; the last row is the model's answer.
    """
    steps, _, _ = data.cot_steps(perms, hops)
    width = steps.shape[-1]
    emitted = []
    for k in range(hops):
        t = steps[k].copy()
        for j, e in enumerate(emitted):  # e_{j+1} sits k - j columns before the end
            t[:, width - k + j] = e
        emitted.append(np.asarray(predict(model, jnp.asarray(t))))
    return np.stack(emitted)


def _train_tokens(n, tokens, answers, n_relation_tokens, d, hidden_mult, width, fit_cfg, seed):
    model = OneLayer(n, n_relation_tokens, d, hidden_mult * d, rngs=nnx.Rngs(seed), width=width,
                     hidden_width=hidden_mult * width)
    stats = training.fit(model, tokens, answers, fit_cfg)
    return model, stats


def multihop(n: int, n_relations: int, d_grid, fit_cfg: training.FitConfig, *, hops: int = 2,
             hidden_mult: int = 4, seed: int = 0, progress=None,
             width: int | None = None) -> list[dict]:
    """``hops``-hop accuracy vs width of two trained one-layer transformers per ``d``.

    * no CoT: trained on ``[s, r_1, ..., r_L] -> e_L`` (one pass, all ``R^L`` chains).
    * CoT: one model trained with teacher forcing on every step of
      :func:`~lab.methods.geomem.data.cot_steps` (emit ``e_1``, read it back, emit
      ``e_2``, ...); evaluated by :func:`cot_generate`, i.e. on its own emissions. Its
      early stop asks a teacher-forced accuracy of ``1 - (1 - target) / L`` on the steps,
      enough for ``target`` on whole chains (a chain fails only where a step does).

    Both arms share ``fit_cfg``'s step budget. A control replaces the emission read at the
    last step by a random entity: a model that reads it answers ``pi_{r_L}`` of the random
    entity (``cot_follows_corruption`` near 1, ``cot_corrupted_answer`` near chance), one
    that bypasses it and answers from the query keeps ``cot_corrupted_answer`` high. Rows:
    ``{"d", "no_cot", "cot", "cot_first_step", "cot_teacher_forced", "cot_corrupted_answer",
    "cot_follows_corruption", "steps_no_cot", "steps_cot"}``.
    """
    perms = data.bijections(seed + 7, n, n_relations)
    tokens, answers, _ = data.queries(perms, hops)
    steps, targets, chain_list = data.cot_steps(perms, hops)
    flat_t, flat_y = steps.reshape(-1, steps.shape[-1]), targets.reshape(-1)
    cot_cfg = fit_cfg if fit_cfg.target is None else dataclasses.replace(
        fit_cfg, target=1 - (1 - fit_cfg.target) / hops)
    width = max(max(d_grid), width or 0)
    rows = []
    for d in d_grid:
        _, s_no = _train_tokens(n, tokens, answers, hops * n_relations, d, hidden_mult, width,
                                fit_cfg, seed)
        cot_model, s_cot = _train_tokens(n, flat_t, flat_y, hops * n_relations, d, hidden_mult,
                                         width, cot_cfg, seed)
        emitted = cot_generate(cot_model, perms, hops)
        # Does the last step read the emission? Replace e_{L-1} by a random entity.
        last = steps[-1].copy()
        last[:, -1] = np.random.default_rng(seed).integers(0, n, last.shape[0])
        follows = np.asarray(predict(cot_model, jnp.asarray(last)))
        expected = perms[chain_list[np.arange(last.shape[0]) // n, -1], last[:, -1]]
        row = {"d": d, "no_cot": s_no["accuracy"],
               "cot": float(np.mean(emitted[-1] == answers)),
               "cot_first_step": float(np.mean(emitted[0] == targets[0])),
               "cot_teacher_forced": s_cot["accuracy"],
               "cot_corrupted_answer": float(np.mean(follows == answers)),
               "cot_follows_corruption": float(np.mean(follows == expected)),
               "steps_no_cot": s_no["steps"], "steps_cot": s_cot["steps"]}
        rows.append(row)
        if progress is not None:
            progress(f"multi-hop d={d}: CoT (own emissions) {row['cot']:.4f}, "
                     f"no CoT {row['no_cot']:.4f}")
    return rows
