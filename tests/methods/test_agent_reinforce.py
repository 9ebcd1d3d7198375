"""Agent-REINFORCE's parts: graphs (DAG checks, fixed topologies), the distribution's
log-probabilities (normalised over an enumerable space) and score function, the executor's
FLOPs against a hand count on a tiny model, the role helpers, the analyst's update on a
hand-built case, the LLM adapter, the budget check and bad input."""

import json

import numpy as np
import pytest
from flax import nnx

from lab.data import ByteTokenizer
from lab.methods import agent_reinforce as ar
from lab.nn import Transformer, TransformerConfig

# --------------------------------------------------------------------------- graphs


def test_graph_rejects_a_cycle_and_bad_nodes():
    with pytest.raises(ValueError, match="cycle through nodes"):
        ar.CollaborationGraph((ar.Node("solver", 0), ar.Node("refiner", 0, (2,)),
                               ar.Node("refiner", 0, (1,))))
    with pytest.raises(ValueError, match="Node.role"):
        ar.Node("judge", 0)
    with pytest.raises(ValueError, match="needs at least one parent"):
        ar.Node("refiner", 0)
    with pytest.raises(ValueError, match="solver reads no parents"):
        ar.Node("solver", 0, (1,))
    with pytest.raises(ValueError, match="parent 5"):
        ar.CollaborationGraph((ar.Node("solver", 0), ar.Node("aggregator", 0, (5,))))
    with pytest.raises(ValueError, match="model=3; expected an index < pool size 2"):
        ar.best_of_n(3, 2).check_pool(2)
    with pytest.raises(ValueError, match="non-empty model pool"):
        ar.best_of_n(0, 1).check_pool(0)
    with pytest.raises(ValueError, match="debate models"):
        ar.debate([], 1)


def test_fixed_topologies_have_the_stated_width_and_depth():
    g = ar.best_of_n(2, 5)
    assert (g.width(), g.depth(), g.models_used()) == (5, 0, (2,))
    g = ar.self_refine(1, 3, critic=True)
    assert (g.width(), g.depth(), len(g.nodes)) == (1, 6, 7)
    g = ar.debate([0, 1, 2], 2)
    assert (g.width(), g.depth()) == (3, 2)
    assert g.nodes[-1].parents == (6, 7, 8) and g.nodes[5].parents == (0, 1, 2)


# --------------------------------------------------------------------------- distribution


def test_log_probabilities_normalise_over_the_space():
    rng = np.random.default_rng(0)
    dist = ar.GraphDistribution(2, 2, 1)
    for k, v in dist.logits.items():
        dist.logits[k] = rng.normal(size=v.shape)
    space = list(dist.enumerate())
    assert len(space) == 4 + 8 + 24 + 16 * 9 * 4 * 2
    total = sum(np.exp(dist.log_prob(c)) for c in space)
    assert abs(total - 1.0) < 1e-9
    # a restricted pool still normalises, and never samples a masked model
    dist2 = ar.GraphDistribution(2, 2, 1, allowed_models=[1])
    assert abs(sum(np.exp(dist2.log_prob(c)) for c in dist2.enumerate()) - 1.0) < 1e-9
    for _ in range(20):
        c = dist2.sample(rng)
        assert {m for row in c.models for m in row} == {1} and c.aggregator == 1


def test_samples_follow_the_probabilities_and_the_score_function_is_the_gradient():
    rng = np.random.default_rng(1)
    dist = ar.GraphDistribution(2, 3, 1)
    dist.logits["width"] = np.array([0.0, 1.0, -1.0])
    ws = [dist.sample(rng).w for _ in range(3000)]
    freq = np.bincount(ws, minlength=4)[1:] / 3000
    assert np.abs(freq - dist.probs("width")).max() < 0.03
    c = dist.sample(rng)
    g = dist.grad_log_prob(c)
    for name in ("width", "edge", "model"):
        idx = np.unravel_index(np.argmax(np.abs(g[name])), g[name].shape)
        eps = 1e-5
        up = dist.copy()
        up.logits[name][idx] += eps
        num = (up.log_prob(c) - dist.log_prob(c)) / eps
        assert abs(num - g[name][idx]) < 1e-3, name


def test_distribution_bad_input():
    with pytest.raises(ValueError, match="n_models=0; expected a non-empty model pool"):
        ar.GraphDistribution(0, 2, 1)
    with pytest.raises(ValueError, match="max_width=0"):
        ar.GraphDistribution(2, 0, 1)
    with pytest.raises(ValueError, match="allowed_models"):
        ar.GraphDistribution(2, 2, 1, allowed_models=[4])


# --------------------------------------------------------------------------- executor


def _tiny_pool():
    cfg = TransformerConfig(vocab_size=264, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1,
                            head_dim=8, d_ff=32, max_len=128)
    models = [Transformer(cfg, rngs=nnx.Rngs(i)) for i in range(2)]
    return ar.ModelPool(["a", "b"], models, ByteTokenizer()), cfg


def _hand_flops(cfg, t):
    """Causal forward FLOPs of ``t`` tokens, counted by hand: per layer q, k, v
    projections, causal attention pairs t(t+1)/2 twice (scores, values), the output
    projection and the SwiGLU MLP; then the LM head."""
    d, h, kv, hd, ff, v = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff, 264
    pairs = t * (t + 1) // 2
    layer = (2 * t * d * (h + 2 * kv) * hd + 2 * 2 * pairs * h * hd + 2 * t * h * hd * d
             + 2 * t * d * 2 * ff + 2 * t * ff * d)
    return cfg.n_layers * layer + 2 * t * d * v


def test_executor_flops_match_a_hand_count_and_node_calls_are_cached():
    pool, cfg = _tiny_pool()
    ex = ar.Executor(pool, rows=4, buckets=((24, 16),))
    probs = ar.Problems(["12+34=?\n", "5+6=?\n"], [46, 11])
    r = ex.run(ar.best_of_n(0, 1, aggregator=0), probs)
    # one solver: prompt (BOS + text) plus the generated tokens (one log-prob each)
    ch = ex.cache[next(iter(ex.cache))][0]
    want = np.mean([_hand_flops(cfg, 1 + len(p) + len(lp))
                    for p, lp in zip(probs.prompts, ch.lp[0], strict=True)])
    assert r.flops == want
    calls = ex.stats["generate_calls"]
    r2 = ex.run(ar.best_of_n(0, 1, aggregator=0), probs)
    assert ex.stats["generate_calls"] == calls and r2.flops == r.flops
    # a vote under another model scores each chain once: BOS + prompt + the chain's bytes
    r3 = ex.run(ar.best_of_n(0, 1, aggregator=1), probs)
    score = np.mean([_hand_flops(cfg, min(1 + len(p) + len(t.encode()), 128))
                     for p, t in zip(probs.prompts, ch.texts, strict=True)])
    assert r3.flops - r.flops == score


def test_role_helpers():
    assert ar.step_spans("12+34=46;46-5=41\nA: 41") == [(0, 9), (9, 17)]
    lp = np.zeros(21)
    lp[12] = -3.0                            # a digit of the second step
    assert ar.least_confident_step("12+34=46;46-5=41\nA: 41", lp) == 1
    assert ar.vote([3, 4, 4, None], [0.9, 0.3, 0.4, 1.0]) == 0   # 0.9 > 0.7
    assert ar.vote([3, 4, 4, None], [0.5, 0.3, 0.4, 1.0]) == 2   # 4 wins, heaviest chain
    assert ar.vote([None, None], [0.1, 0.2]) == 1


def test_executor_bad_input():
    pool, _ = _tiny_pool()
    with pytest.raises(ValueError, match="empty model pool"):
        ar.ModelPool([], [], ByteTokenizer())
    with pytest.raises(ValueError, match="max_len"):
        ar.Executor(pool, buckets=((100, 100),))
    with pytest.raises(ValueError, match="vote="):
        ar.Executor(pool, vote="mean")
    with pytest.raises(ValueError, match="Problems.prompts is empty"):
        ar.Problems([], [])
    ex = ar.Executor(pool, rows=2, buckets=((24, 16),))
    with pytest.raises(ValueError, match="pool size 2"):
        ex.run(ar.best_of_n(2, 1), ar.Problems(["1+2=?\n"], [3]))


# --------------------------------------------------------------------------- feedback


def _outcome(i, role, model, parents, acc, flops=1.0):
    return ar.NodeOutcome(i, role, model, tuple(parents), acc, flops, 0.1)


def _eval(c, nodes, acc, feasible=True):
    r = ar.Result(acc, sum(o.flops for o in nodes), 0.2, tuple(nodes), ())
    return ar.Evaluation(c, r, acc, feasible)


def test_analyst_moves_probability_toward_what_helped():
    """Hand-built: model 1's solvers are right, model 0's wrong; refiners gain, critics do
    not; width 2 graphs score higher than width 1."""
    dist = ar.GraphDistribution(2, 2, 1)
    c1 = ar.Choices(1, 1, ((0,), (1,)), ((1,),), (((False,),),), 1)
    c2 = ar.Choices(2, 1, ((1, 1), (0, 0)), ((1, 0),), (((False, False), (False, False)),), 1)
    h = [
        _eval(c1, [_outcome(0, "solver", 0, [], 0.2), _outcome(1, "refiner", 1, [0], 0.5),
                   _outcome(2, "aggregator", 1, [1], 0.5)], 0.5),
        _eval(c2, [_outcome(0, "solver", 1, [], 0.7), _outcome(1, "solver", 1, [], 0.7),
                   _outcome(2, "refiner", 0, [0], 0.8), _outcome(3, "critic", 0, [1], 0.7),
                   _outcome(4, "aggregator", 1, [2, 3], 0.8)], 0.8),
    ]
    before = {k: dist.probs(k) for k in ("model", "role", "width")}
    fb = ar.RuleBasedAnalyst().feedback(h, h, ar.Objective(), dist)
    assert fb.text and all(isinstance(it, ar.FeedbackItem) for it in fb.items)
    dist.apply(fb.delta(dist), 1.0)
    assert dist.probs("model")[0, 0, 1] > before["model"][0, 0, 1] + 0.1     # solvers: model 1
    refiner, critic = ar.LAYER_ROLES.index("refiner"), ar.LAYER_ROLES.index("critic")
    assert dist.probs("role")[0, 0, refiner] > before["role"][0, 0, refiner]
    assert dist.probs("role")[0, 0, critic] < before["role"][0, 0, critic]
    assert dist.probs("width")[1] > before["width"][1] + 0.1


def test_analyst_pushes_away_from_graphs_over_the_budget():
    dist = ar.GraphDistribution(2, 2, 0)
    cheap = ar.Choices(1, 0, ((0,),), (), (), 0)
    wide = ar.Choices(2, 0, ((1, 1),), (), (), 1)
    h = [_eval(cheap, [_outcome(0, "solver", 0, [], 0.4, 1),
                       _outcome(1, "aggregator", 0, [0], 0.4, 0)], 0.4),
         _eval(wide, [_outcome(0, "solver", 1, [], 0.6, 5), _outcome(1, "solver", 1, [], 0.6, 5),
                      _outcome(2, "aggregator", 1, [0, 1], 0.7, 0)], 0.7, feasible=False)]
    fb = ar.RuleBasedAnalyst().feedback(h, h, ar.Objective(budget=3.0), dist)
    dist.apply(fb.delta(dist))
    assert dist.probs("width")[1] < 0.5


def test_llm_analyst_parses_a_reply_and_rejects_a_bad_one():
    dist = ar.GraphDistribution(2, 2, 1)
    c = ar.Choices(1, 0, ((1,),), (), (), 1)
    h = [_eval(c, [_outcome(0, "solver", 1, [], 0.6), _outcome(1, "aggregator", 1, [0], 0.6)],
               0.6)]
    seen = []

    def client(prompt):
        seen.append(prompt)
        return "Raise width 2.\n" + json.dumps([{"param": "width", "index": [1], "delta": 1.5,
                                                 "reason": "wider votes help"},
                                                {"param": "model", "index": [0, None, 1],
                                                 "delta": 9.0}])

    agent = ar.LLMAnalyst(client, names=["a", "b"])
    fb = agent.feedback(h, h, ar.Objective(), dist)
    assert "acc=0.60" in seen[0] and "width 1 depth 0" in seen[0]
    d = fb.delta(dist)
    assert d["width"][1] == 1.5 and d["model"][0, 1, 1] == 2.0 and d["model"][1, 0, 1] == 0
    with pytest.raises(ValueError, match="no JSON list"):
        ar.LLMAnalyst(lambda p: "no idea").feedback(h, h, ar.Objective(), dist)
    with pytest.raises(ValueError, match="param='temperature'"):
        ar.parse_feedback('[{"param": "temperature", "index": [], "delta": 1}]', dist)
    with pytest.raises(ValueError, match="outside width"):
        ar.parse_feedback('[{"param": "width", "index": [7], "delta": 1}]', dist)
    fallback = ar.LLMAnalyst(lambda p: "?", fallback=ar.RuleBasedAnalyst())
    assert isinstance(fallback.feedback(h, h, ar.Objective(), dist), ar.Feedback)


def test_objective_fronts_and_bad_budgets():
    obj = ar.Objective(budget=10.0, latency_weight=0.5)
    r = ar.Result(0.8, 12.0, 0.2, (), ())
    assert not obj.feasible(r) and obj.value(r) == pytest.approx(0.7)
    with pytest.raises(ValueError, match="Objective.cost"):
        ar.Objective(cost="energy")
    with pytest.raises(ValueError, match="Objective.budget"):
        ar.Objective(budget=0.0)
    front = ar.pareto_front([(0.5, 1.0), (0.6, 2.0), (0.4, 1.5), (0.7, 3.0), (0.6, 2.5)])
    assert front == [(0.5, 1.0), (0.6, 2.0), (0.7, 3.0)]
    assert ar.hypervolume(front, 4.0) == pytest.approx(0.5 * 1 + 0.6 * 1 + 0.7 * 1)


def test_a_budget_no_graph_can_meet_raises():
    pool, _ = _tiny_pool()
    ex = ar.Executor(pool, rows=2, buckets=((24, 16),))
    probs = ar.Problems(["1+2=?\n", "3+4=?\n"], [3, 7])
    with pytest.raises(ValueError, match="cannot be met"):
        ar.search("random", ar.GraphDistribution(2, 2, 1), ex, probs, ar.Objective(budget=1.0),
                  n_graphs=2)
    with pytest.raises(ValueError, match="method="):
        ar.search("anneal", ar.GraphDistribution(2, 2, 1), ex, probs, ar.Objective(),
                  n_graphs=2)
    with pytest.raises(ValueError, match="dist.n_models=3"):
        ar.search("random", ar.GraphDistribution(3, 2, 1), ex, probs, ar.Objective(),
                  n_graphs=2)


def test_search_runs_every_method_on_a_tiny_pool():
    pool, _ = _tiny_pool()
    ex = ar.Executor(pool, rows=2, buckets=((24, 16),))
    probs = ar.Problems(["1+2=?\n", "3+4=?\n"], [3, 7])
    dist = ar.GraphDistribution(2, 2, 1)
    for method in ar.METHODS:
        tr = ar.search(method, dist, ex, probs, ar.Objective(budget=1e9), n_graphs=4, batch=2)
        assert len(tr.evaluations) == 4 and len(tr.best_so_far()) == 4
        assert all(np.all(np.isfinite(v)) for v in tr.dist.logits.values())
        if method == "random":    # random search never moves its distribution
            assert all(np.array_equal(tr.dist.logits[k], dist.logits[k]) for k in dist.logits)
    assert all(np.all(v == 0) for v in dist.logits.values())   # the caller's is untouched
