"""GOLD PANNING: Bayesian active search over document orderings (output-only access).

Reading of the GOLD PANNING abstract (NeurIPS 2026): a long-context
LM answers from the document it *attends to*, and where a document sits in the
prompt changes how likely the model is to use it (position bias). Instead of
fighting that bias inside the model, GOLD PANNING treats the model as a noisy
sensor whose noise depends on position, and searches for the relevant ("gold")
document among N by querying the model with chosen orderings:

1. **Diagnosticity profile.** For each position ``p``,
   ``TPR(p) = P(model follows the document at p | it is the gold one)`` and
   ``FPR(p) = P(model follows the document at p | it is not)``, measured on
   calibration prompts with known gold positions (:func:`measure_profile`).
   A position is diagnostic when following it separates gold from non-gold
   (``TPR - FPR`` large).
2. **Belief state.** A posterior ``b_i = P(document i is gold)`` over the N
   documents, uniform at the start.
3. **Signal anchoring (greedy assignment).** Each round the documents are
   ranked by belief and placed, highest first, at the positions ranked by
   diagnosticity (:func:`assign`). A document the model once flagged stays at
   the most diagnostic slot ("once flagged, keep it in sight"), so weak cues
   are confirmed or refuted rather than lost in the middle.
4. **Bayes' rule.** The model's output flags (at most) one document, so the
   likelihood of an answer is categorical (:func:`update`): under "document i
   is gold" (at slot ``p_i``) the model follows ``p_i`` with ``TPR(p_i)``,
   another slot ``q`` with ``FPR(q)`` (scaled down if the rates would sum
   past 1), and no document with the rest; :func:`simulated_query` samples
   exactly this model. (Reading each slot as an independent binary signal
   instead counts "the gold's slot was not followed", ``(1-TPR)/(1-FPR)``, as
   evidence on top of "another slot was", which one answer already implies:
   with TPR near 0.9 that made one answer about 8x too convincing, and stopping
   at belief 0.95 named the target 0.92 of the time.)
5. **Stopping rule.** Stop when ``max_i b_i >= threshold`` or after ``budget``
   queries; the answer is ``argmax_i b_i``. When the likelihood is right the
   posterior is calibrated, so stopping at ``threshold`` identifies the target
   with probability ``>= threshold``; each round multiplies the gold's odds by
   a bounded-below factor in expectation, so reaching the threshold from prior
   odds ``1/(N-1)`` takes ``O(log N)`` rounds.

Baselines (same ``query`` interface): one pass in the given order
(:func:`single_pass`); Permutation Self-Consistency (Tang et al. 2023,
"Found in the Middle"): shuffle ``m`` times and aggregate the answers by
vote (:func:`psc`; with one flagged document per answer, Kemeny aggregation
of the top-1 is the plurality vote); uncertainty reduction (active learning,
Lindley 1956, "On a measure of the information provided by an experiment";
MacKay 1992, "Information-based objective functions for active data
selection"): the same Bayes update, but each round's ordering is the one that
maximises the expected information gain about the gold document,
``I(G; Y | order) = H(Y) - sum_i b_i H(Y | G = i)`` under the categorical
likelihood of (4) (:func:`expected_information_gain`), found by hill climbing
over slot swaps from the anchoring order (``rule="info_gain"``,
:func:`info_gain_orders`); ``rule="random"`` shuffles each round (Bayes
without ordering).

A ``query(rows, orders) -> observed`` callable is the only access to the
model: ``rows`` [B'] indexes the problems still searching, ``orders``
[B', N] gives the document index at each position (``orders[b, p]``), and
``observed`` [B'] is the *position* whose document the model followed, or
-1 when its answer matches no document. :func:`simulated_query` is such a
model with a known profile.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from scipy.special import logsumexp

RULES = ("anchor", "info_gain", "random")
Query = Callable[[np.ndarray, np.ndarray], np.ndarray]


class Profile(NamedTuple):
    """Diagnosticity profile: ``tpr[p]``, ``fpr[p]`` for positions ``p < N`` (float arrays)."""

    tpr: np.ndarray
    fpr: np.ndarray

    @property
    def n(self) -> int:
        return len(self.tpr)


def check_n(n, name: str = "n_docs") -> int:
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 2:
        raise ValueError(f"{name}={n!r}; expected an int >= 2 (documents to search)")
    return int(n)


def check_probability(value, name: str, *, open_interval: bool = False) -> float:
    ok = isinstance(value, (int, float, np.floating)) and not isinstance(value, bool)
    lo_ok = ok and (value > 0 if open_interval else value >= 0)
    hi_ok = ok and (value < 1 if open_interval else value <= 1)
    if not (lo_ok and hi_ok):
        rng = "(0, 1)" if open_interval else "[0, 1]"
        raise ValueError(f"{name}={value!r}; expected a probability in {rng}")
    return float(value)


def make_profile(tpr, fpr) -> Profile:
    """Checked :class:`Profile`: equal lengths >= 2, finite rates in [0, 1]."""
    t, f = np.asarray(tpr, np.float64), np.asarray(fpr, np.float64)
    for name, a in (("tpr", t), ("fpr", f)):
        if a.ndim != 1:
            raise ValueError(f"profile.{name} has shape {a.shape}; expected [N]")
        bad = ~np.isfinite(a) | (a < 0) | (a > 1)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"profile.{name}[{i}]={float(a[i])!r}; "
                             "expected a probability in [0, 1]")
    if t.shape != f.shape:
        raise ValueError(f"profile.tpr has {t.size} positions but profile.fpr has {f.size}; "
                         "expected the same N")
    check_n(t.size, "profile N")
    return Profile(t, f)


def measure_profile(gold_positions, observed, n: int) -> Profile:
    """Profile from calibration queries with known gold positions.

    ``gold_positions[k]`` is where the gold document sat in query ``k`` and
    ``observed[k]`` the position the model followed (-1: none).
    ``TPR(p)`` = fraction of queries with gold at ``p`` that followed ``p``;
    ``FPR(p)`` = fraction of queries with gold elsewhere that followed ``p``.
    Returns the raw (unclipped) :class:`Profile`.
    """
    n = check_n(n)
    g, o = np.asarray(gold_positions), np.asarray(observed)
    if g.shape != o.shape or g.ndim != 1 or g.size == 0:
        raise ValueError(f"gold_positions {g.shape} and observed {o.shape}; expected equal [K]")
    if g.min() < 0 or g.max() >= n or o.min() < -1 or o.max() >= n:
        raise ValueError(f"positions must lie in [0, {n}) (observed may be -1)")
    pos = np.arange(n)
    at = g[:, None] == pos[None, :]
    hit = o[:, None] == pos[None, :]
    n_at = at.sum(0)
    if (n_at == 0).any():
        raise ValueError(f"no calibration query has its gold at positions "
                         f"{pos[n_at == 0].tolist()}; expected every position covered")
    tpr = (at & hit).sum(0) / n_at
    fpr = (~at & hit).sum(0) / np.maximum((~at).sum(0), 1)
    return make_profile(tpr, fpr)


def resize_profile(profile: Profile, n: int) -> Profile:
    """The profile at ``n`` positions by linear interpolation over relative position.

    TPR keeps its value at the same relative depth; FPR is also scaled by
    ``old_n / n``, so the total false-follow mass ``sum_p FPR(p)`` is kept (the
    model follows one document per answer, so each of more documents is
    followed less often by mistake).
    """
    n = check_n(n)
    old = np.linspace(0.0, 1.0, profile.n)
    new = np.linspace(0.0, 1.0, n)
    tpr = np.interp(new, old, profile.tpr)
    fpr = np.clip(np.interp(new, old, profile.fpr) * profile.n / n, 0.0, 1.0)
    return make_profile(tpr, fpr)


def clip_profile(profile: Profile, floor: float) -> Profile:
    """Rates clipped to ``[floor, 1 - floor]`` so no observation has likelihood 0."""
    floor = check_probability(floor, "floor", open_interval=True)
    if floor >= 0.5:
        raise ValueError(f"floor={floor!r}; expected a probability in (0, 0.5)")
    return Profile(np.clip(profile.tpr, floor, 1 - floor), np.clip(profile.fpr, floor, 1 - floor))


def diagnosticity(profile: Profile) -> np.ndarray:
    """``TPR(p) - FPR(p)`` per position (Youden's J): how much following p says."""
    return np.asarray(profile.tpr) - np.asarray(profile.fpr)


def _false_follow_scale(tpr_gold, others):
    """``s = min(1, (1 - TPR(gold slot)) / others)``: the factor on the other slots' FPRs so a
    one-answer model's follow probabilities sum to at most 1 (``others``: their FPR sum)."""
    return np.minimum(1.0, (1 - tpr_gold) / np.maximum(others, 1e-300))


def _likelihood_parts(pos_of_doc, tpr, fpr):
    """Per document i (at slot ``pos_of_doc[..., i]``) under "i is gold": ``TPR(p_i)``, the
    false-follow scale ``s_i`` and the no-document probability (floored at ``min(FPR)``)
    of :func:`update`'s likelihood."""
    t = tpr[pos_of_doc]
    others = fpr.sum() - fpr[pos_of_doc]               # false-follow mass of the other slots
    scale = _false_follow_scale(t, others)
    none = np.maximum(1 - t - scale * others, fpr.min())
    return t, scale, none


def update(log_belief: np.ndarray, orders: np.ndarray, observed: np.ndarray, tpr: np.ndarray,
           fpr: np.ndarray) -> np.ndarray:
    """Bayes' rule for one query per row; returns the normalised log posterior [B, N].

    ``log_belief`` [B, N] over documents, ``orders`` [B, N] (document at each
    position), ``observed`` [B] (followed position or -1). Under "doc i is
    gold", with ``p_i`` its slot and ``s_i = min(1, (1 - TPR(p_i)) / sum_{q !=
    p_i} FPR(q))``, the answer follows ``p_i`` with probability ``TPR(p_i)``,
    another slot ``q`` with ``s_i FPR(q)``, and no document with the rest,
    floored at ``min(FPR)`` so that an answer naming no document never rules a
    document out. A pure numpy function: the arrays are at most a few hundred
    by 64, where numpy takes microseconds and an XLA compile per shape takes
    seconds on a loaded CPU.
    """
    observed = np.asarray(observed)[:, None]
    pos_of_doc = np.argsort(orders, axis=1)            # inverse permutation
    t, scale, none = _likelihood_parts(pos_of_doc, tpr, fpr)
    followed_other = scale * fpr[np.maximum(observed, 0)]
    lik = np.where(pos_of_doc == observed, t, np.where(observed >= 0, followed_other, none))
    post = log_belief + np.log(lik)
    return post - logsumexp(post, axis=1, keepdims=True)


def _xlogx(x):
    return np.where(x > 0, x * np.log(np.maximum(x, 1e-300)), 0.0)


def expected_information_gain(belief: np.ndarray, pos_of_doc: np.ndarray, tpr: np.ndarray,
                              fpr: np.ndarray) -> np.ndarray:
    """``I(G; Y) = H(Y) - sum_i b_i H(Y | G = i)`` in nats, per row [B].

    ``belief`` [B, N] over documents, ``pos_of_doc`` [B, N] each document's slot,
    ``Y`` the followed slot (or none) under :func:`update`'s likelihood: with ``S =
    sum_i b_i s_i``, ``P(Y = p_j) = b_j TPR(p_j) + FPR(p_j) (S - b_j s_j)`` and
    ``P(none) = sum_i b_i none_i``; ``H(Y | G = i)`` sums ``t log t``, the other slots'
    ``s_i FPR(q) log(s_i FPR(q))`` (in closed form from ``sum FPR`` and ``sum FPR log FPR``)
    and ``none log none``. O(N) per row.
    """
    t, s, none = _likelihood_parts(pos_of_doc, tpr, fpr)
    f = fpr[pos_of_doc]
    big_s = (belief * s).sum(1, keepdims=True)
    p_slot = belief * t + f * (big_s - belief * s)
    p_none = (belief * none).sum(1)
    h_y = -(_xlogx(p_slot).sum(1) + _xlogx(p_none))
    f_sum, g_sum = fpr.sum(), _xlogx(fpr).sum()
    rest = _xlogx(s) * (f_sum - f) + s * (g_sum - _xlogx(f))
    h_given = -(_xlogx(t) + rest + _xlogx(none))
    return h_y - (belief * h_given).sum(1)


def info_gain_orders(log_belief: np.ndarray, start: np.ndarray, tpr: np.ndarray,
                     fpr: np.ndarray, rng: np.random.Generator, swaps: int) -> np.ndarray:
    """Orders [B, N] that (locally) maximise :func:`expected_information_gain`.

    Hill climbing from ``start`` [B, N]: ``swaps`` times, every row proposes
    exchanging the documents of two random slots and keeps the exchange when the
    expected information gain rises. A local optimum, not the maximum over all N!
    orders.
    """
    belief = np.exp(log_belief)
    b, n = start.shape
    orders = start.copy()
    pos = np.argsort(orders, axis=1)
    best = expected_information_gain(belief, pos, tpr, fpr)
    rows = np.arange(b)
    for _ in range(swaps):
        a = rng.integers(0, n, b)
        c = (a + rng.integers(1, n, b)) % n                  # another slot
        da, dc = orders[rows, a], orders[rows, c]
        cand = pos.copy()
        cand[rows, da], cand[rows, dc] = c, a
        gain = expected_information_gain(belief, cand, tpr, fpr)
        take = gain > best + 1e-12
        r = rows[take]
        orders[r, a[take]], orders[r, c[take]] = dc[take], da[take]
        pos[take] = cand[take]
        best = np.where(take, gain, best)
    return orders


def assign(log_belief: np.ndarray, diag: np.ndarray, rng: np.random.Generator,
           rule: str) -> np.ndarray:
    """Orders [B, N] for the next round: ``orders[b, p]`` = document placed at position p.

    ``"anchor"`` (signal anchoring; also the start of ``"info_gain"``'s search, see
    :func:`info_gain_orders`): documents by belief (highest first) onto positions by
    diagnosticity (highest first); ``"random"``: a uniform shuffle. Ties are broken at
    random (``rng``).
    """
    b, n = log_belief.shape
    if rule == "random":
        return np.argsort(rng.random((b, n)), axis=1)
    docs = np.lexsort((rng.random((b, n)), -log_belief), axis=1)   # best document first
    slots = np.argsort(-np.asarray(diag), kind="stable")          # most diagnostic position first
    orders = np.empty((b, n), np.int64)
    orders[:, slots] = docs
    return orders


class SearchResult(NamedTuple):
    """What :func:`search` returns.

    prediction: [B] the argmax-belief document when the search stopped.
    queries:    [B] queries used (rounds).
    trajectory: [B, budget + 1] the argmax-belief document after q queries (q = 0..budget),
                frozen after the stop, so a run at a smaller budget is a prefix of it.
    max_belief: [B] the top posterior at the stop.
    """

    prediction: np.ndarray
    queries: np.ndarray
    trajectory: np.ndarray
    max_belief: np.ndarray


def _check_common(n_docs, n_problems, budget) -> tuple[int, int, int]:
    n = check_n(n_docs)
    if not isinstance(n_problems, (int, np.integer)) or n_problems < 1:
        raise ValueError(f"n_problems={n_problems!r}; expected a positive int")
    if not isinstance(budget, (int, np.integer)) or isinstance(budget, bool) or budget < 1:
        raise ValueError(f"budget={budget!r}; expected a positive int (queries per problem)")
    return n, int(n_problems), int(budget)


def _check_observed(obs, m: int, n: int) -> np.ndarray:
    obs = np.asarray(obs)
    if obs.shape != (m,) or obs.min() < -1 or obs.max() >= n:
        raise ValueError(f"query returned {obs.shape} values in [{obs.min()}, {obs.max()}]; "
                         f"expected [{m}] positions in [-1, {n})")
    return obs.astype(np.int32)


def search(query: Query, n_docs: int, n_problems: int, profile: Profile, *,
           threshold: float = 0.9, budget: int = 16, rule: str = "anchor",
           seed: int = 0, swaps: int | None = None) -> SearchResult:
    """GOLD PANNING on ``n_problems`` searches at once; returns a :class:`SearchResult`.

    ``profile`` must have ``n_docs`` positions with rates strictly inside
    (0, 1) (see :func:`clip_profile`). Each round the rows still searching get
    orders from :func:`assign` (``"info_gain"``: then :func:`info_gain_orders` with
    ``swaps`` proposals, default ``4 N``), one ``query`` call, and a :func:`update`.
    """
    n, b, budget = _check_common(n_docs, n_problems, budget)
    threshold = check_probability(threshold, "threshold", open_interval=True)
    if rule not in RULES:
        raise ValueError(f"rule={rule!r}; expected one of {RULES}")
    if profile.n != n:
        raise ValueError(f"profile has {profile.n} positions; expected n_docs={n}")
    if min(profile.tpr.min(), profile.fpr.min()) <= 0 or max(profile.tpr.max(),
                                                            profile.fpr.max()) >= 1:
        raise ValueError("profile rates must lie strictly inside (0, 1); use clip_profile")
    tpr, fpr = np.asarray(profile.tpr), np.asarray(profile.fpr)
    diag = diagnosticity(profile)
    swaps = 4 * n if swaps is None else swaps
    if not isinstance(swaps, (int, np.integer)) or isinstance(swaps, bool) or swaps < 0:
        raise ValueError(f"swaps={swaps!r}; expected an int >= 0 (info_gain's proposals)")
    log_b = np.full((b, n), -np.log(n))
    rng = np.random.default_rng(seed)
    queries = np.zeros(b, np.int64)
    active = np.ones(b, bool)
    traj = np.zeros((b, budget + 1), np.int64)  # uniform prior: all tie; report document 0
    for q in range(1, budget + 1):
        rows = np.flatnonzero(active)
        if rows.size == 0:
            traj[:, q:] = traj[:, q - 1:q]
            break
        orders = assign(log_b[rows], diag, rng, rule)
        if rule == "info_gain":
            orders = info_gain_orders(log_b[rows], orders, tpr, fpr, rng, swaps)
        obs = _check_observed(query(rows, orders), rows.size, n)
        log_b[rows] = update(log_b[rows], orders, obs, tpr, fpr)
        queries[rows] += 1
        pb = np.exp(log_b)
        traj[:, q] = pb.argmax(1)
        active &= pb.max(1) < threshold
    pb = np.exp(log_b)
    return SearchResult(pb.argmax(1), queries, traj, pb.max(1))


def single_pass(query: Query, n_docs: int, n_problems: int) -> np.ndarray:
    """One query in the given order; returns the followed document per row (-1: none)."""
    n, b, _ = _check_common(n_docs, n_problems, 1)
    orders = np.tile(np.arange(n), (b, 1))
    obs = _check_observed(query(np.arange(b), orders), b, n)
    return np.where(obs >= 0, orders[np.arange(b), np.maximum(obs, 0)], -1)


def psc(query: Query, n_docs: int, n_problems: int, m: int, *, seed: int = 0) -> np.ndarray:
    """Permutation Self-Consistency: ``m`` shuffled queries, plurality vote.

    Returns [B, m] predictions after 1..m shuffles (-1 while no document has a
    vote; ties go to the document that reached the count first).
    Tang et al. 2023, "Found in the Middle: Permutation Self-Consistency
    Improves Listwise Ranking in Large Language Models".
    """
    n, b, m = _check_common(n_docs, n_problems, m)
    rng = np.random.default_rng(seed)
    votes = np.zeros((b, n), np.int64)
    first = np.full((b, n), np.iinfo(np.int64).max)
    out = np.full((b, m), -1, np.int64)
    idx = np.arange(b)
    for j in range(m):
        orders = np.argsort(rng.random((b, n)), axis=1)
        obs = _check_observed(query(idx, orders), b, n)
        hit = obs >= 0
        doc = orders[idx, np.maximum(obs, 0)]
        votes[idx[hit], doc[hit]] += 1
        first[idx[hit], doc[hit]] = np.minimum(first[idx[hit], doc[hit]], j)
        reach = votes * (m + 1) - np.minimum(first, m)  # more votes first, then earlier
        out[:, j] = np.where(votes.max(1) > 0, reach.argmax(1), -1)
    return out


def simulated_query(profile: Profile, gold: np.ndarray, seed: int = 0) -> Query:
    """A model with a known profile: a :data:`Query` for problems whose gold docs are ``gold``.

    With gold at position ``g`` it follows ``g`` with probability ``TPR(g)``,
    each other position ``q`` with probability ``FPR(q)``, and nothing with the
    rest (the non-gold rates are scaled down when the total would exceed 1).
    """
    tpr, fpr = np.asarray(profile.tpr), np.asarray(profile.fpr)
    gold = np.asarray(gold)
    rng = np.random.default_rng(seed)

    def query(rows: np.ndarray, orders: np.ndarray) -> np.ndarray:
        m, n = orders.shape
        g = np.argmax(orders == gold[rows][:, None], axis=1)
        p = np.tile(fpr, (m, 1))
        p[np.arange(m), g] = 0.0
        scale = _false_follow_scale(tpr[g], p.sum(1))
        p *= scale[:, None]
        p[np.arange(m), g] = tpr[g]
        p = np.concatenate([p, 1 - p.sum(1, keepdims=True)], axis=1)
        u = rng.random((m, 1))
        pick = (np.cumsum(p, axis=1) < u).sum(1)
        return np.where(pick >= n, -1, pick)

    return query


def f1(prediction: np.ndarray, gold: np.ndarray) -> float:
    """Micro F1 of target identification; prediction -1 = abstain (no document named).

    precision = correct / named, recall = correct / problems.
    """
    pred, gold = np.asarray(prediction), np.asarray(gold)
    correct = float(((pred == gold) & (pred >= 0)).sum())
    named = float((pred >= 0).sum())
    if correct == 0:
        return 0.0
    p, r = correct / named, correct / len(gold)
    return 2 * p * r / (p + r)


def answer_f1(predicted, gold) -> float:
    """Mean SQuAD token F1 (Rajpurkar et al. 2016) of answer strings, with characters as
    tokens (the answers here are single numbers, whose word-level F1 is exact match);
    ``None`` (abstain) scores 0.

    F1 of one answer = 2 P R / (P + R) over the multiset overlap of characters, P = overlap
    / len(predicted), R = overlap / len(gold).
    """
    if len(predicted) != len(gold) or not len(gold):
        raise ValueError(f"predicted has {len(predicted)} answers and gold {len(gold)}; "
                         "expected the same non-zero count")
    total = 0.0
    for p, g in zip(predicted, gold, strict=True):
        if not p or not g:
            continue
        common = sum((Counter(p) & Counter(g)).values())
        if common:
            prec, rec = common / len(p), common / len(g)
            total += 2 * prec * rec / (prec + rec)
    return total / len(gold)
