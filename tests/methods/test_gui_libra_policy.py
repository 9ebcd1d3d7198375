"""GUI-Libra's policy side: the action-aware token weights, the offline and online
evaluations on scripted policies, the online RL source and the gui_valid reward."""

import json

import numpy as np
import pytest
from flax import nnx

from lab.data import ByteTokenizer
from lab.methods import gui_libra as gl
from lab.methods.gui_libra import policy as P
from lab.nn import Transformer, TransformerConfig

TOK = ByteTokenizer()


def test_decisive_spans_are_the_action_line_and_the_last_grounded_id():
    text = "want x. a#1 no. b#2 yes. so open b; b#7\nclick(7)"
    spans = P.decisive_spans(text)
    assert [text[a:b] for a, b in spans] == ["click(7)", "7"]
    assert P.decisive_spans("click(3)") == [(0, 8)]


def test_encode_weighted_upweights_action_and_grounding_tokens_only():
    ex = [{"prompt": "s\nreason:\n", "completion": "open b; b#4\nclick(4)"},
          {"prompt": "s\ndirect:\n", "completion": "type(2,ann)"}]
    a = P.encode_weighted(ex, TOK, 48, action_weight=3.0)
    for i, e in enumerate(ex):
        m = a["mask"][i] > 0
        assert TOK.decode(a["targets"][i][m]) == e["completion"]   # loss on the completion
        assert a["targets"][i][m][-1] == TOK.eos_id
        heavy = TOK.decode(a["targets"][i][m & (a["weights"][i] == 3.0)])
        assert heavy == ("4click(4)" if i == 0 else "type(2,ann)")
        assert set(a["weights"][i][m].tolist()) <= {1.0, 3.0}
    with pytest.raises(ValueError, match="action_weight"):
        P.encode_weighted(ex, TOK, 48, action_weight=0)
    with pytest.raises(ValueError, match="seq_len"):
        P.encode_weighted(ex, TOK, 8)


def test_sft_examples_and_prompts_name_the_mode():
    rows, _ = gl.curate(gl.demonstrations(5, seed=0))
    ex = P.sft_examples(rows, ("reason", "direct"))
    assert len(ex) == 2 * len(rows)
    assert ex[0]["prompt"].endswith("\nreason:\n") and ex[1]["completion"] == rows[0]["action"]
    assert ex[0]["completion"].endswith("\n" + rows[0]["action"])
    with pytest.raises(ValueError, match="mode"):
        P.prompt("x", "verbose")


def _oracle_and_bad(monkeypatch):
    """An expert act that looks up the live environment of each screen, by recording the
    environments the rollout makes."""
    made = []

    class Recorded(gl.GuiEnv):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    monkeypatch.setattr(P, "GuiEnv", Recorded)

    def expert(screens):
        live = [e for e in made if not e.s["done"]]
        return [next(e for e in live if e.render() == s).valid_actions()[0] for s in screens]

    return expert


def test_offline_and_online_eval_score_an_expert_perfectly_and_a_bad_policy_at_zero(
        monkeypatch):
    rows = gl.demonstrations(20, seed=3, p_wrong=0, p_mismatch=0)
    expert_offline = {r["prompt"]: json.loads(r["valid"])[0] for r in rows}
    off = P.offline_eval(lambda screens: [expert_offline[s] for s in screens], rows)
    assert off == {"step_accuracy": 1.0, "grounding_accuracy": 1.0, "malformed": 0.0}
    bad = P.offline_eval(lambda screens: ["press(1)"] * len(screens), rows)
    assert bad == {"step_accuracy": 0.0, "grounding_accuracy": 0.0, "malformed": 1.0}
    expert = _oracle_and_bad(monkeypatch)
    on = P.online_eval(expert, 12, seed=5)
    assert on["success"] == 1.0 and all(v == 1.0 for k, v in on.items() if "/" in k)
    assert P.online_eval(lambda s: ["click(0)"] * len(s), 6, seed=5)["success"] == 0.0


def test_rollouts_record_each_visited_state_with_its_valid_actions(monkeypatch):
    expert = _oracle_and_bad(monkeypatch)
    envs, visited = P.rollouts(expert, [1, 2, 3])
    for e, states in zip(envs, visited, strict=True):
        assert e.s["success"] and len(states) == e.s["steps"]
        for st in states:
            env = gl.GuiEnv.from_state(st["state"])
            assert env.render() == st["screen"] and json.loads(st["valid"]) == \
                env.valid_actions()


def test_gui_valid_reward_scores_the_action_line():
    valid = json.dumps(["click(3)", "click(4)"])
    got = P.gui_valid(["p"] * 3, ["open a; a#3\nclick(3)", "click(5)", "open a; a#3"],
                      valid=[valid] * 3)
    assert got == [1.0, 0.0, None]


def test_lm_policy_and_online_source_give_rl_rows_of_visited_states():
    cfg = TransformerConfig(vocab_size=264, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                            head_dim=16, d_ff=64, max_len=192)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    source = P.online_source(TOK, "direct", episodes=3, prompts_per_step=4,
                             max_new_tokens=6, width=128, seed=1)
    rows = source(0, model)
    assert 1 <= len(rows) <= 4
    for r in rows:
        assert r["prompt"].endswith("\ndirect:\n") and r["task"] in gl.TASKS
        assert isinstance(json.loads(r["valid"]), list)
    again = source(0, model)
    assert [r["prompt"] for r in again] == [r["prompt"] for r in rows]  # pure in (step, model)
    out = P.lm_policy(model, TOK, "direct", max_new_tokens=6, width=128, batch=2)(
        [r["prompt"].rsplit("\n", 2)[0] for r in rows])
    assert len(out) == len(rows) and all(isinstance(t, str) for t in out)
    assert np.mean([len(t) for t in out]) <= 6 * 4
