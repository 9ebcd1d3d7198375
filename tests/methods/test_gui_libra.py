"""GUI-Libra's environment and data pipeline: transitions, valid-action sets, the strict
action grammar, the filters, and shortcut policies near chance."""

import json

import numpy as np
import pytest

from lab.methods import gui_libra as gl


def _episode(env, policy, seed):
    obs = env.reset(seed)
    done, info = False, {}
    while not done:
        obs, reward, done, info = env.step(policy([obs])[0])
    return info["success"]


def test_a_toggle_episode_by_hand():
    env = gl.GuiEnv("toggle")
    obs = env.reset(3)
    lines = obs.split("\n")
    assert lines[0].startswith("goal: ") and lines[1] == "@home"
    ids = {ln.split("#")[0]: int(ln.split("#")[1].split()[0]) for ln in lines[2:]}
    assert set(ids) == {"settings", "profile", "shop"}
    # Only the settings link is valid from home on a toggle task.
    assert env.valid_actions() == [f"click({ids['settings']})"]
    obs, reward, done, info = env.step(f"click({ids['settings']})")
    assert obs.split("\n")[1] == "@settings" and reward == 0.0 and not done
    assert info == {"valid": True, "error": None, "success": False, "steps": 1}
    # Both goal toggles are valid (two valid actions in one state), the others are not.
    goal = env.s["goal"]
    toggles = {e.name: e.id for e in env.elements() if e.kind == "toggle"}
    assert sorted(env.valid_actions()) == sorted(f"click({toggles[t]})" for t in goal)
    for t in goal:
        obs, reward, done, info = env.step(f"click({toggles[t]})")
    assert reward == 1.0 and done and info["success"]
    with pytest.raises(ValueError, match="after the episode ended"):
        env.step("click(1)")


@pytest.mark.parametrize("action", ["clk(1)", "", "click(0)", "click(12)", "type(3)",
                                    "type(2,Ann)", "click(1) extra", None])
def test_a_malformed_action_is_a_failed_step_not_a_crash(action):
    env = gl.GuiEnv()
    before = env.reset(5)
    state = json.dumps(env.state())
    obs, reward, done, info = env.step(action)
    assert obs == before and reward == 0.0 and info["error"] == "malformed"
    assert not info["valid"] and info["steps"] == 1
    env.s["steps"] = 0
    assert json.dumps(env.state()) == state


def test_an_invalid_action_leaves_the_state_unchanged():
    env = gl.GuiEnv("fill")
    before = env.reset(7)
    on_screen = {e.id for e in env.elements()}
    missing = next(i for i in range(1, 10) if i not in on_screen)
    link = next(e.id for e in env.elements() if e.kind == "link")
    for bad in (f"click({missing})", f"type({link},ann)"):
        obs, reward, done, info = env.step(bad)
        assert obs == before and info["error"] == "invalid" and not info["valid"]


def test_repeated_failed_steps_end_the_episode_at_the_step_limit():
    env = gl.GuiEnv("search")
    env.reset(1)
    limit = env.s["max_steps"]
    assert limit == env.cost() + gl.env.SLACK
    for t in range(limit):
        _, reward, done, info = env.step("nope")
        assert done == (t == limit - 1) and reward == 0.0
    assert not info["success"]


def test_expert_plans_are_optimal_valid_and_succeed_on_every_task():
    rng = np.random.default_rng(0)
    several = states = 0
    for task in gl.TASKS:
        for seed in range(12):
            env = gl.GuiEnv(task)
            env.reset(seed)
            plan = gl.expert_plan(env, rng)
            assert len(plan) == env.cost()
            for a in plan:
                valid = env.valid_actions()
                several += len(valid) > 1
                states += 1
                assert a in valid and a in env.candidate_actions()
                _, reward, done, info = env.step(a)
                assert info["valid"] and info["error"] is None
            assert done and reward == 1.0
    assert several / states > 0.05   # some states admit several valid actions


def test_the_image_carries_the_screen_text():
    env = gl.GuiEnv()
    text = env.reset(2)
    img = env.render_image(width=96)
    assert img.dtype == np.uint8 and img.shape == (10 * len(text.split("\n")), 96, 3)
    for r, line in enumerate(text.split("\n")):
        bits = (img[10 * r + 1:10 * r + 9, :len(line)].max(axis=2) > 0).astype(np.uint8)
        assert np.packbits(bits, axis=0)[0].tobytes().decode() == line


def test_ids_and_order_do_not_say_what_an_element_is():
    # Across episodes, the settings link's id and position on the home screen vary.
    ids, positions = set(), set()
    for seed in range(40):
        lines = gl.GuiEnv().reset(seed).split("\n")[2:]
        pos = next(i for i, ln in enumerate(lines) if ln.startswith("settings#"))
        positions.add(pos)
        ids.add(lines[pos].split("#")[1].split()[0])
    assert len(positions) == 3 and len(ids) >= 6


def test_shortcut_policies_stay_near_chance():
    rows = gl.demonstrations(60, seed=4, p_wrong=0.0, p_mismatch=0.0)
    chance = gl.random_step_chance(rows)
    prompts = [r["prompt"] for r in rows]
    for name in gl.SHORTCUTS:
        acts = gl.shortcut_policy(name, seed=1)(prompts)
        assert all(gl.is_well_formed(a) for a in acts)
        step_acc = np.mean([a in json.loads(r["valid"]) for a, r in zip(acts, rows, strict=True)])
        assert step_acc < 0.45, (name, step_acc)      # an expert scores 1.0
        if name == "random":
            assert abs(step_acc - chance) < 0.08
        success = np.mean([_episode(gl.GuiEnv(), gl.shortcut_policy(name, seed=s), 100 + s)
                           for s in range(60)])
        assert success < 0.15, (name, success)        # the expert's success is 1.0


def test_the_filters_drop_the_noisy_steps():
    rows = gl.demonstrations(80, seed=0, p_wrong=0.15, p_mismatch=0.1)
    noisy = sum(bool(r["noise"]) for r in rows)
    assert 0.15 * len(rows) < noisy < 0.35 * len(rows)
    kept, counts = gl.curate(rows, max_per_key=2)
    assert counts["raw"] == len(rows) > counts["after_consistency"] > counts[
        "after_redundancy"] == len(kept)
    assert counts["noisy_kept"] == 0
    assert all(gl.consistent(r) for r in kept)
    ds = gl.to_dataset(kept)
    assert len(ds) == len(kept) and {"prompt", "action", "reasoning", "valid"} <= set(
        ds.column_names)


def test_bad_input_names_the_field():
    with pytest.raises(ValueError, match="task='drive'"):
        gl.GuiEnv("drive")
    with pytest.raises(ValueError, match="p_wrong=1.5"):
        gl.demonstrations(1, seed=0, p_wrong=1.5)
    with pytest.raises(ValueError, match="max_per_key=0"):
        gl.curate([], max_per_key=0)
    with pytest.raises(ValueError, match="no rows"):
        gl.to_dataset([])
    with pytest.raises(ValueError, match="shortcut='best'"):
        gl.shortcut_policy("best")
