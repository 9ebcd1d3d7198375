"""Maze: LLM-free planning over ordered few-shot exemplars (the Maze / MultiMaze abstract).

An ordered exemplar sequence is a prompt trajectory. A frozen :class:`Encoder` embeds the
query and the exemplar pool (cached); a learnable :class:`PathScorer` (a metric over the
query->exemplar and exemplar->exemplar transitions) ranks trajectories; :func:`beam_search`
proposes the best ones without calling the LM; :func:`maze_answer` spends one LM call on the
top trajectory, :func:`multimaze_answer` ``m`` calls on the top-``m`` and votes. The scorer
is trained from logged ``(trajectory, success)`` outcomes on training queries with a
pairwise logistic ranking loss (RankNet, Burges et al. 2005).

Trajectory order: ``traj[0]`` is the exemplar next to the query (the last one in the
prompt), ``traj[i + 1]`` the one before ``traj[i]``: the path starts at the query.

:class:`RuleTask` is the in-context rule-induction task the experiment plans on (a reader
LM trained here, :func:`train_reader`): every exemplar ``a o_j c`` shows rule ``j``
(``c = g_j(a)``, ``g_j`` a fixed permutation); the reader answers a query ``t a`` with
``g_j(a)`` for the rule of the exemplar next to the query (recency). In a test world each
query tag ``t`` has a hidden rule ``pi(t)`` that no exemplar names, so which exemplar is
placed last decides the answer, and the query alone carries nothing about it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from lab.nn import Transformer, TransformerConfig


def _check_pool(k: int, pool_size: int) -> None:
    if pool_size < 1:
        raise ValueError(f"pool_size={pool_size} is invalid; expected a non-empty exemplar "
                         "pool (>= 1 exemplar)")
    if not 1 <= k <= pool_size:
        raise ValueError(f"k={k} is invalid; expected 1 <= k <= pool_size={pool_size} "
                         "(a trajectory uses distinct exemplars)")


# --------------------------------------------------------------------------- encoder


class Encoder:
    """Frozen encoder ``encode(texts) -> [n, d]`` float32, cached per text.

    ``fn`` maps a list of texts to an ``[n, d]`` array: any user function,
    :func:`lm_encoder` (a zoo LM's pooled hidden states) or :func:`hf_encoder`.
    """

    def __init__(self, fn: Callable[[list[str]], np.ndarray]):
        self.fn = fn
        self.cache: dict[str, np.ndarray] = {}
        self.calls = 0

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            raise ValueError("texts=[] is invalid; expected at least one text to encode")
        new = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if new:
            out = np.asarray(self.fn(new), np.float32)
            if out.ndim != 2 or out.shape[0] != len(new):
                raise ValueError(f"encoder output shape {out.shape} is invalid; expected "
                                 f"[{len(new)}, d]")
            self.calls += 1
            self.cache.update(zip(new, out, strict=True))
        return np.stack([self.cache[t] for t in texts])


def lm_encoder(model: Transformer, tokenize: Callable[[str], Sequence[int]], *,
               layer: int = -1, pad_id: int = 0) -> Encoder:
    """Encoder from an LM's hidden states (``capture=("hidden",)``), mean-pooled over the
    text's tokens at ``layer`` (default the last block's output)."""

    def fn(texts):
        ids = [list(tokenize(t)) for t in texts]
        n = max(len(i) for i in ids)
        tok = np.full((len(ids), n), pad_id, np.int32)
        mask = np.zeros((len(ids), n), bool)
        for r, i in enumerate(ids):
            tok[r, :len(i)], mask[r, :len(i)] = i, True
        _, inter = model(jnp.asarray(tok), mask=jnp.asarray(mask), capture=("hidden",))
        h = np.asarray(inter.hidden[layer], np.float32)
        return (h * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)

    return Encoder(fn)


def hf_encoder(model, tokenizer, *, max_length: int = 128) -> Encoder:
    """Adapter for a Hugging Face-style encoder (e.g. one loaded through :mod:`lab.hf`):
    ``tokenizer(texts, padding=True, ...)`` then ``model(**batch)``'s
    ``last_hidden_state`` mean-pooled under the attention mask."""

    def fn(texts):
        batch = tokenizer(list(texts), padding=True, truncation=True, max_length=max_length,
                          return_tensors="np")
        h = np.asarray(model(**batch).last_hidden_state, np.float32)
        m = np.asarray(batch["attention_mask"], np.float32)[..., None]
        return (h * m).sum(1) / m.sum(1)

    return Encoder(fn)


# --------------------------------------------------------------------------- path scorer


class PathScorer(nnx.Module):
    """Learnable metric over a trajectory's transitions.

    ``score(q, E) = sum_i w_i <A q, B e_i> + sum_i <C e_i, D e_{i+1}> + sum_i u . e_i``
    for ``q [n, d]`` and ``E [n, j, d]`` (any ``j <= k``, so partial paths score too):
    query->exemplar terms weighted per position ``w_i``, exemplar->exemplar transitions and
    an exemplar prior.
    """

    def __init__(self, d: int, k: int, hidden: int = 32, *, rngs: nnx.Rngs):
        init = nnx.initializers.normal(1.0 / np.sqrt(d))
        self.a = nnx.Linear(d, hidden, kernel_init=init, rngs=rngs)
        self.b = nnx.Linear(d, hidden, kernel_init=init, rngs=rngs)
        self.c = nnx.Linear(d, hidden, kernel_init=init, rngs=rngs)
        self.e = nnx.Linear(d, hidden, kernel_init=init, rngs=rngs)
        self.u = nnx.Linear(d, 1, use_bias=False, rngs=rngs)
        self.w = nnx.Param(jnp.ones((k,)))
        self.k = k

    def __call__(self, q: jax.Array, ex: jax.Array) -> jax.Array:
        j = ex.shape[1]
        qe = jnp.einsum("nh,njh->nj", self.a(q), self.b(ex)) * self.w[:j]
        s = qe.sum(1) + self.u(ex)[..., 0].sum(1)
        if j > 1:
            s = s + jnp.einsum("njh,njh->n", self.c(ex[:, :-1]), self.e(ex[:, 1:]))
        return s


def ranking_loss(scores: jax.Array, success: jax.Array) -> jax.Array:
    """Pairwise logistic ranking loss over ``[Q, R]`` scores of R logged trajectories per
    query: mean over pairs (success, failure) of the same query of
    ``log(1 + exp(s_fail - s_success))``; 0 where a query has no such pair."""
    diff = scores[:, :, None] - scores[:, None, :]          # [Q, pos, neg] = s_pos - s_neg
    pair = success[:, :, None] * (1.0 - success[:, None, :])
    return (pair * jax.nn.softplus(-diff)).sum() / jnp.maximum(pair.sum(), 1.0)


def trajectory_scores(scorer: PathScorer, q_emb, pool_emb, trajs) -> jax.Array:
    """Scores ``[Q, R]`` of trajectories ``trajs [Q, R, j]`` (pool indices) for queries
    with embeddings ``q_emb [Q, d]``."""
    qn, r, j = trajs.shape
    ex = jnp.asarray(pool_emb)[trajs.reshape(-1, j)]
    q = jnp.repeat(jnp.asarray(q_emb), r, axis=0)
    return scorer(q, ex).reshape(qn, r)


def train_path_scorer(scorer: PathScorer, q_emb, pool_emb, trajs, success, *,
                      steps: int = 300, learning_rate: float = 1e-2,
                      weight_decay: float = 1e-4) -> np.ndarray:
    """Fits ``scorer`` to logged outcomes ``success [Q, R]`` of ``trajs [Q, R, k]`` with
    :func:`ranking_loss` (AdamW, full batch); returns the loss per step."""
    if steps < 1:
        raise ValueError(f"steps={steps} is invalid; expected >= 1")
    opt = nnx.Optimizer(scorer, optax.adamw(learning_rate, weight_decay=weight_decay),
                        wrt=nnx.Param)
    q, p = jnp.asarray(q_emb), jnp.asarray(pool_emb)
    t, y = jnp.asarray(trajs), jnp.asarray(success, jnp.float32)

    @nnx.jit
    def step(scorer, opt):
        def loss_fn(s):
            return ranking_loss(trajectory_scores(s, q, p, t), y)
        loss, grads = nnx.value_and_grad(loss_fn)(scorer)
        opt.update(scorer, grads)
        return loss

    return np.array([float(step(scorer, opt)) for _ in range(steps)])


def ranking_auc(scores, success) -> float:
    """Fraction of (success, failure) pairs of the same query ranked correctly (ties 1/2);
    0.5 is chance."""
    s, y = np.asarray(scores), np.asarray(success, bool)
    num = den = 0.0
    for si, yi in zip(s, y, strict=True):
        pos, neg = si[yi], si[~yi]
        if pos.size and neg.size:
            d = pos[:, None] - neg[None, :]
            num += (d > 0).sum() + 0.5 * (d == 0).sum()
            den += d.size
    return float(num / den) if den else float("nan")


# --------------------------------------------------------------------------- planner


def beam_search(score_fn: Callable[[np.ndarray], np.ndarray], pool_size: int, k: int, *,
                beam: int = 8, top: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Beam search over ordered trajectories of ``k`` distinct exemplars of a pool.

    ``score_fn(paths [n, j]) -> [n]`` scores (partial) paths of pool indices; at each depth
    every beam path is extended by every unused exemplar and the ``beam`` best are kept.
    Returns the ``top`` best full paths ``[top, k]`` and their scores, best first. No LM.
    """
    _check_pool(k, pool_size)
    if beam < 1 or top < 1:
        raise ValueError(f"beam={beam}, top={top} are invalid; expected both >= 1")
    paths = np.zeros((1, 0), np.int64)
    scores = np.zeros(1)
    for depth in range(k):
        ext = np.concatenate([np.repeat(paths, pool_size, 0),
                              np.tile(np.arange(pool_size), len(paths))[:, None]], 1)
        ok = (ext[:, :-1] != ext[:, -1:]).all(1)
        ext = ext[ok]
        s = np.asarray(score_fn(ext), np.float64)
        keep = beam if depth < k - 1 else max(beam, top)
        order = np.argsort(-s, kind="stable")[:keep]
        paths, scores = ext[order], s[order]
    return paths[:top], scores[:top]


@nnx.jit
def _score_paths(scorer, qq, p, paths):
    return scorer(jnp.repeat(qq, paths.shape[0], 0), p[paths])


def scorer_fn(scorer: PathScorer, q: np.ndarray, pool_emb: np.ndarray):
    """``score_fn`` for :func:`beam_search` from a trained scorer and one query ``q [d]``."""
    p = jnp.asarray(pool_emb)
    qq = jnp.asarray(q)[None]

    def fn(paths):
        return np.asarray(_score_paths(scorer, qq, p, jnp.asarray(paths)))

    return fn


def vote(answers: Sequence[int]) -> int:
    """Majority answer; ties go to the answer seen first (the better-ranked trajectory)."""
    vals, first, counts = np.unique(np.asarray(answers), return_index=True, return_counts=True)
    best = counts == counts.max()
    return int(vals[best][np.argmin(first[best])])


def maze_answer(lm: Callable, query, paths: np.ndarray) -> int:
    """One LM call on the top trajectory ``paths[0]``: ``lm([(query, path)]) -> [answer]``."""
    return int(lm([(query, paths[0])])[0])


def multimaze_answer(lm: Callable, query, paths: np.ndarray, m: int) -> int:
    """``m`` LM calls on the top-``m`` trajectories, aggregated by :func:`vote`."""
    if not 1 <= m <= len(paths):
        raise ValueError(f"m={m} is invalid; expected 1 <= m <= {len(paths)} planned paths")
    return vote(lm([(query, p) for p in paths[:m]]))


# --------------------------------------------------------------------------- the task


@dataclasses.dataclass(frozen=True)
class RuleTask:
    """In-context rule induction (see the module docstring). Tokens: values
    ``[0, n_values)``, rule markers ``o_j``, query tags ``t``; an exemplar is
    ``(a, o_j, g_j(a))``, a prompt is ``k`` exemplars then ``(t, a_q)``."""

    n_values: int = 16
    n_rules: int = 8
    n_tags: int = 8
    k: int = 3
    seed: int = 0

    @property
    def vocab_size(self) -> int:
        return self.n_values + self.n_rules + self.n_tags

    @property
    def prompt_len(self) -> int:
        return 3 * self.k + 2

    def perms(self) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 11])
        return np.stack([rng.permutation(self.n_values) for _ in range(self.n_rules)])

    def prompts(self, ex: np.ndarray, tags: np.ndarray, a: np.ndarray) -> np.ndarray:
        """``ex [n, k, 3]`` (value, rule, value) in trajectory order (``ex[:, 0]`` next
        to the query) -> prompt tokens ``[n, 3k + 2]``."""
        v, r = self.n_values, self.n_rules
        tok = ex.copy()
        tok[..., 1] += v
        tok = tok[:, ::-1].reshape(len(ex), -1)
        return np.concatenate([tok, (tags + v + r)[:, None], a[:, None]], 1).astype(np.int32)

    def reader_batch(self, rng, n: int):
        """Reader training data: random exemplars and tags; target = the rule of the
        exemplar next to the query applied to the query's value."""
        g = self.perms()
        a = rng.integers(self.n_values, size=(n, self.k))
        rule = rng.integers(self.n_rules, size=(n, self.k))
        ex = np.stack([a, rule, g[rule, a]], -1)
        qa = rng.integers(self.n_values, size=n)
        tags = rng.integers(self.n_tags, size=n)
        return self.prompts(ex, tags, qa), g[rule[:, 0], qa]

    def world(self, pool_size: int, n_queries: int, seed: int):
        """A test world: a pool ``[P, 3]`` of exemplars, a hidden tag->rule map ``pi``,
        queries ``(tags, a)`` and their answers ``g_{pi(t)}(a)``."""
        rng = np.random.default_rng([self.seed, seed, 3])
        g = self.perms()
        rule = np.arange(pool_size) % self.n_rules
        rng.shuffle(rule)
        a = rng.integers(self.n_values, size=pool_size)
        pool = np.stack([a, rule, g[rule, a]], -1)
        pi = rng.permutation(self.n_rules)[np.arange(self.n_tags) % self.n_rules]
        tags = rng.integers(self.n_tags, size=n_queries)
        qa = rng.integers(self.n_values, size=n_queries)
        return pool, pi, tags, qa, g[pi[tags], qa]

    def exemplar_text(self, e) -> str:
        return f"v{e[0]} o{e[1]} v{e[2]}"

    def query_text(self, tag, a) -> str:
        return f"t{tag} v{a}"

    def tokenize(self, text: str) -> list[int]:
        off = {"v": 0, "o": self.n_values, "t": self.n_values + self.n_rules}
        return [off[w[0]] + int(w[1:]) for w in text.split()]


def reader_config(task: RuleTask, d_model: int = 48, n_layers: int = 2) -> TransformerConfig:
    return TransformerConfig(vocab_size=task.vocab_size, d_model=d_model, n_layers=n_layers,
                             n_heads=4, n_kv_heads=2, head_dim=d_model // 4,
                             d_ff=4 * d_model, max_len=task.prompt_len + 1)


def train_reader(task: RuleTask, *, steps: int = 600, batch: int = 128,
                 learning_rate: float = 3e-3, d_model: int = 48, n_layers: int = 2,
                 seed: int = 0) -> tuple[Transformer, np.ndarray]:
    """Trains the reader LM on :meth:`RuleTask.reader_batch` (cross-entropy on the answer
    token); returns the model and its loss per step."""
    model = Transformer(reader_config(task, d_model, n_layers), rngs=nnx.Rngs(seed))
    opt = nnx.Optimizer(model, optax.adam(learning_rate), wrt=nnx.Param)

    @nnx.jit
    def step(model, opt, tok, y):
        def loss_fn(m):
            logits = m(tok)[:, -1]
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        opt.update(model, grads)
        return loss

    rng = np.random.default_rng([seed, 17])
    losses = []
    for _ in range(steps):
        tok, y = task.reader_batch(rng, batch)
        losses.append(float(step(model, opt, jnp.asarray(tok), jnp.asarray(y))))
    return model, np.array(losses)


class ReaderLM:
    """The LM behind a call budget: ``self([(query, path), ...]) -> answers``; every
    prompt is one LM call (counted in ``calls``, its time in ``seconds``). Greedy, or
    sampled at ``temperature`` with :meth:`sample`. Values only (answers are values)."""

    def __init__(self, model: Transformer, task: RuleTask, pool: np.ndarray):
        self.model, self.task, self.pool = model, task, pool
        self.calls, self.seconds = 0, 0.0
        self._logits = nnx.jit(lambda m, t: m(t)[:, -1, :task.n_values])

    def logits(self, queries, paths, *, zero_shot: bool = False) -> np.ndarray:
        t0 = time.perf_counter()
        tags = np.array([q[0] for q in queries])
        a = np.array([q[1] for q in queries])
        if zero_shot:
            tok = np.concatenate([(tags + self.task.n_values + self.task.n_rules)[:, None],
                                  a[:, None]], 1).astype(np.int32)
        else:
            tok = self.task.prompts(self.pool[np.asarray(paths)], tags, a)
        out = np.asarray(self._logits(self.model, jnp.asarray(tok)))
        self.calls += len(queries)
        self.seconds += time.perf_counter() - t0
        return out

    def __call__(self, items) -> np.ndarray:
        qs, ps = zip(*items, strict=True)
        return self.logits(list(qs), list(ps)).argmax(-1)

    def sample(self, queries, paths, n: int, seed: int, *, temperature: float = 1.0,
               zero_shot: bool = False) -> np.ndarray:
        """``n`` sampled answers per query ``[len(queries), n]`` (n calls each)."""
        lg = self.logits([q for q in queries for _ in range(n)],
                         None if zero_shot else [p for p in paths for _ in range(n)],
                         zero_shot=zero_shot)
        key = jax.random.PRNGKey(seed)
        s = jax.random.categorical(key, jnp.asarray(lg) / temperature)
        return np.asarray(s).reshape(len(queries), n)
