"""Maze's parts: the path scorer's training and held-out ranking, beam search under a
hand-built scorer, the encoder cache, bad input, and the task's shortcut check."""

import itertools

import numpy as np
import pytest
from flax import nnx

from lab.methods import maze


def _planted(rng, n_q, r, pool, k, d=8):
    """Embeddings where success = the exemplar next to the query matches its hidden type."""
    types = rng.integers(4, size=pool)
    basis = rng.normal(size=(4, d))
    pool_emb = basis[types] + 0.1 * rng.normal(size=(pool, d))
    qt = rng.integers(4, size=n_q)
    q_emb = np.roll(basis, 1, axis=0)[qt] + 0.1 * rng.normal(size=(n_q, d))  # not similar
    trajs = np.stack([[rng.permutation(pool)[:k] for _ in range(r)] for _ in range(n_q)])
    success = (types[trajs[..., 0]] == qt[:, None]).astype(np.float32)
    return q_emb.astype(np.float32), pool_emb.astype(np.float32), trajs, success


def test_path_scorer_training_lowers_its_loss_and_ranks_held_out_trajectories():
    rng = np.random.default_rng(0)
    q, p, t, y = _planted(rng, 96, 12, 16, 3)
    scorer = maze.PathScorer(8, 3, 16, rngs=nnx.Rngs(0))
    losses = maze.train_path_scorer(scorer, q[:64], p, t[:64], y[:64], steps=150,
                                    learning_rate=1e-2)
    assert losses[-1] < 0.5 * losses[0]
    auc = maze.ranking_auc(np.asarray(maze.trajectory_scores(scorer, q[64:], p, t[64:])),
                           y[64:])
    assert auc > 0.8, auc


def test_ranking_loss_prefers_successes_ranked_higher():
    import jax.numpy as jnp
    y = jnp.array([[1.0, 0.0]])
    assert maze.ranking_loss(jnp.array([[2.0, 0.0]]), y) < maze.ranking_loss(
        jnp.array([[0.0, 2.0]]), y)


def test_beam_search_finds_the_best_trajectory_under_a_hand_built_scorer():
    rng = np.random.default_rng(1)
    pool, k = 7, 3
    unary = rng.normal(size=(k, pool))
    pair = rng.normal(size=(pool, pool))

    def score(paths):
        s = sum(unary[i, paths[:, i]] for i in range(paths.shape[1]))
        for i in range(paths.shape[1] - 1):
            s = s + pair[paths[:, i], paths[:, i + 1]]
        return s

    every = np.array(list(itertools.permutations(range(pool), k)))
    best = every[np.argmax(score(every))]
    paths, scores = maze.beam_search(score, pool, k, beam=pool * pool, top=2)
    assert paths[0].tolist() == best.tolist()
    assert scores[0] >= scores[1]
    assert len(set(paths[0].tolist())) == k


def test_bad_input_is_a_clear_value_error():
    with pytest.raises(ValueError, match="k=5 is invalid"):
        maze.beam_search(lambda p: np.zeros(len(p)), 3, 5)
    with pytest.raises(ValueError, match="pool_size=0 is invalid"):
        maze.beam_search(lambda p: np.zeros(len(p)), 0, 1)
    with pytest.raises(ValueError, match="texts=\\[\\]"):
        maze.Encoder(lambda t: np.zeros((len(t), 2))).encode([])
    with pytest.raises(ValueError, match="m=4 is invalid"):
        maze.multimaze_answer(lambda items: [0] * len(items), (0, 0), np.zeros((2, 1), int), 4)


def test_encoder_caches_texts():
    seen = []
    enc = maze.Encoder(lambda t: (seen.extend(t), np.ones((len(t), 3)))[1])
    enc.encode(["a", "b"])
    out = enc.encode(["b", "a", "c"])
    assert out.shape == (3, 3) and seen == ["a", "b", "c"]


def test_vote_breaks_ties_by_rank():
    assert maze.vote([3, 1, 1]) == 1 and maze.vote([2, 5]) == 2


def test_task_world_has_no_shortcut():
    task = maze.RuleTask()
    pool, pi, tags, qa, ans = task.world(24, 2000, 0)
    chance = 1.0 / task.n_values
    # answers: near uniform; the query's value alone gives g_j(a) for one rule j: 1/n_rules
    assert np.bincount(ans).max() / len(ans) < chance + 0.05
    g = task.perms()
    best_single_rule = max(np.mean(g[j, qa] == ans) for j in range(task.n_rules))
    assert best_single_rule < 1.0 / task.n_rules + 0.1
    # the reader's training data: the query tag says nothing about the answer's rule
    tok, y = task.reader_batch(np.random.default_rng(0), 4000)
    tag_rule = tok[:, -2] - task.n_values - task.n_rules
    hits = [np.mean(g[(tag_rule + s) % task.n_rules, tok[:, -1]] == y)
            for s in range(task.n_rules)]
    assert max(hits) < 1.0 / task.n_rules + 0.1


def test_hf_encoder_mean_pools_under_the_attention_mask():
    class Out:
        def __init__(self, h):
            self.last_hidden_state = h

    def tokenizer(texts, **kw):
        n = max(len(t) for t in texts)
        mask = np.array([[1] * len(t) + [0] * (n - len(t)) for t in texts])
        return {"input_ids": mask.copy(), "attention_mask": mask}

    def model(input_ids, attention_mask):
        h = np.cumsum(np.ones(input_ids.shape), axis=1)[..., None].repeat(2, -1)
        return Out(h)

    out = maze.hf_encoder(model, tokenizer).encode(["ab", "abcd"])
    assert np.allclose(out[:, 0], [1.5, 2.5])


def test_lm_encoder_pools_a_transformer_and_ignores_padding():
    task = maze.RuleTask(k=1)
    model = maze.Transformer(maze.reader_config(task, 16, 1), rngs=nnx.Rngs(0))
    enc = maze.lm_encoder(model, task.tokenize)
    both = enc.encode(["v1 o2 v3", "t1 v2"])
    alone = maze.lm_encoder(model, task.tokenize).encode(["t1 v2"])
    assert both.shape == (2, 16) and np.allclose(both[1], alone[0], atol=1e-5)
