"""GUI-Libra's policy: action-aware SFT, acting in the environment, offline and online
evaluation, and the online source and reward for KL-constrained RL on ``lab.train.rl``.

The policy is a Lab language model that reads a screen (:meth:`GuiEnv.render`) and a
mode line, and writes a completion ending in one action line:

* ``"reason"``: a short reasoning naming the element (``"open settings; settings#1"``),
  then the action (``"click(1)"``);
* ``"direct"``: the action alone;
* ``"long"``: the long chain of thought of the demonstrations, then the action (the
  "SFT with long CoT only" baseline of the paper).

Action-aware SFT (GUI-Libra, Sec. "action-aware SFT"): the training set mixes
reasoning-then-action and direct-action samples of each demonstrated step, and the
tokens that decide the action (the action line and the element id the reasoning grounds
on) weigh ``action_weight`` times the others in the token-weighted cross-entropy
(:func:`lab.train.sft_loss`). RL (:func:`online_source`, the ``gui_valid`` reward) runs
online: each RL step's prompts are the states the current policy visits in fresh episodes,
rewarded 1 when the sampled action is one of the state's valid actions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence

import numpy as np

from lab import infer
from lab.data.batching import step_indices
from lab.methods.gui_libra.env import GuiEnv, completion_action, parse_action
from lab.train import TrainConfig, Trainer, rewards, sft_loss

MODES = ("reason", "direct", "long")
_ID_RE = re.compile(r"#(\d+)")


def prompt(screen: str, mode: str) -> str:
    """The policy's prompt: the screen, then the mode line ``"<mode>:"``."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; expected one of {MODES}")
    return f"{screen}\n{mode}:\n"


def completion(row: dict, mode: str) -> str:
    """The SFT target of a demonstration ``row`` (:func:`demonstrations`) in ``mode``."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; expected one of {MODES}")
    if mode == "direct":
        return row["action"]
    return row["reasoning" if mode == "reason" else "long_reasoning"] + "\n" + row["action"]


def decisive_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of ``text`` (a completion) that decide the action: the action line
    and the element id of the reasoning's last grounding (``name#<id>`` after its last
    ``;``)."""
    line = text.rfind("\n") + 1
    spans = [(line, len(text))]
    reasoning = text[:max(line - 1, 0)]
    last = reasoning.rfind(";")
    ids = list(_ID_RE.finditer(reasoning, max(last, 0)))
    if ids:
        spans.append(ids[-1].span(1))
    return spans


def sft_examples(rows: Sequence[dict], modes: Sequence[str]) -> list[dict]:
    """One ``{"prompt", "completion", "mode"}`` example per demonstration row and mode."""
    if not modes:
        raise ValueError("modes=(); expected at least one of " + str(MODES))
    return [{"prompt": prompt(r["prompt"], m), "completion": completion(r, m), "mode": m}
            for r in rows for m in modes]


def encode_weighted(examples: Sequence[dict], tokenizer, seq_len: int,
                    action_weight: float = 1.0) -> dict[str, np.ndarray]:
    """SFT arrays ``{"inputs", "targets", "mask", "weights"}`` of shape ``[N, seq_len]``:
    the loss on the completion (and its EOS) only, its :func:`decisive_spans` tokens (and
    the EOS) weighted ``action_weight``, the rest 1. The completion is tokenised span by
    span, so a span's tokens are exactly its text's."""
    if not isinstance(action_weight, (int, float)) or action_weight <= 0:
        raise ValueError(f"action_weight={action_weight!r}; expected a number > 0")
    n = len(examples)
    if n == 0:
        raise ValueError("examples is empty; expected at least one SFT example")
    out = {"inputs": np.full((n, seq_len), tokenizer.pad_id, np.int32),
           "targets": np.full((n, seq_len), tokenizer.pad_id, np.int32),
           "mask": np.zeros((n, seq_len), np.float32),
           "weights": np.zeros((n, seq_len), np.float32)}
    for i, ex in enumerate(examples):
        ids = tokenizer.encode(ex["prompt"], add_bos=True)
        w = [0.0] * len(ids)
        text, cuts, pos = ex["completion"], sorted(decisive_spans(ex["completion"])), 0
        for a, b in cuts:
            for seg, weight in ((text[pos:a], 1.0), (text[a:b], float(action_weight))):
                t = tokenizer.encode(seg) if seg else []
                ids += t
                w += [weight] * len(t)
            pos = b
        tail = tokenizer.encode(text[pos:]) if pos < len(text) else []
        ids += tail + [tokenizer.eos_id]
        w += [1.0] * len(tail) + [float(action_weight)]
        if len(ids) > seq_len + 1:
            raise ValueError(f"example {i} has {len(ids)} tokens > seq_len + 1 = "
                             f"{seq_len + 1}; raise seq_len")
        t = len(ids) - 1
        n_prompt = len(tokenizer.encode(ex["prompt"], add_bos=True))
        out["inputs"][i, :t] = ids[:-1]
        out["targets"][i, :t] = ids[1:]
        out["mask"][i, n_prompt - 1:t] = 1.0
        out["weights"][i, :t] = w[1:]
    return out


def train_sft(model, tokenizer, examples: Sequence[dict], *, steps: int, batch_size: int,
              learning_rate: float, seq_len: int, action_weight: float = 1.0,
              warmup_steps: int = 20, seed: int = 0, eval_every: int = 0,
              eval_fn: Callable | None = None):
    """Token-weighted SFT of ``model`` on ``examples`` (AdamW, cosine schedule); returns
    ``(model, history)``, ``history`` the trainer's metric records (``eval_fn(model, step)``
    every ``eval_every`` steps and at the end, as :class:`lab.train.Trainer`)."""
    arrays = encode_weighted(examples, tokenizer, seq_len, action_weight)
    cfg = TrainConfig(steps=steps, learning_rate=learning_rate, warmup_steps=warmup_steps,
                      schedule="cosine", seed=seed, eval_every=eval_every, progress=False)
    n = len(examples)

    def batch_fn(step):
        idx = step_indices(n, batch_size, step, seed)
        return {k: v[idx] for k, v in arrays.items()}

    trainer = Trainer(model, sft_loss, cfg)
    model = trainer.fit(batch_fn, eval_fn=eval_fn)
    return model, trainer.history


def lm_policy(model, tokenizer, mode: str, *, max_new_tokens: int, width: int,
              batch: int = 64, temperature: float = 0.0, seed: int = 0):
    """``policy(screens) -> completions`` of the language model in ``mode``: prompts
    right-padded to ``width`` tokens and batched by ``batch`` rows (the last batch padded),
    so one compiled program serves every call; greedy at ``temperature=0``."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; expected one of {MODES}")
    calls = [0]

    def policy(screens: Sequence[str]) -> list[str]:
        texts = []
        for i in range(0, len(screens), batch):  # each call's batches draw fresh seeds
            texts += infer.complete(model, tokenizer,
                                    [prompt(s, mode) for s in screens[i:i + batch]],
                                    max_new_tokens=max_new_tokens, width=width, batch=batch,
                                    temperature=temperature, seed=seed + calls[0])
            calls[0] += 1
        return texts

    return policy


def as_actions(policy: Callable) -> Callable:
    """``screens -> actions`` from a ``screens -> completions`` policy (the last line)."""
    return lambda screens: [completion_action(c) for c in policy(screens)]


def _element_ids(actions: Sequence[str]) -> set[int]:
    return {p[1] for p in map(parse_action, actions) if p is not None}


def offline_eval(act: Callable, rows: Sequence[dict]) -> dict[str, float]:
    """Offline metrics of ``act(screens) -> actions`` on demonstration ``rows``:
    ``step_accuracy`` (the action is one of the state's valid actions: any of several
    counts), ``grounding_accuracy`` (it names an element some valid action acts on) and
    ``malformed`` (outside the action grammar)."""
    acts = act([r["prompt"] for r in rows])
    ok, ground, bad = [], [], []
    for r, a in zip(rows, acts, strict=True):
        valid = json.loads(r["valid"])
        p = parse_action(a)
        ok.append(a in valid)
        ground.append(p is not None and p[1] in _element_ids(valid))
        bad.append(p is None)
    return {"step_accuracy": float(np.mean(ok)), "grounding_accuracy": float(np.mean(ground)),
            "malformed": float(np.mean(bad))}


def rollouts(act: Callable, seeds: Sequence[int]) -> tuple[list[GuiEnv], list[list[dict]]]:
    """Runs one episode per seed with ``act(screens) -> actions``, all episodes stepped
    together (one policy call per round); returns the finished environments and, per
    episode, the visited states ``{"screen", "state", "valid", "task"}``."""
    envs = [GuiEnv() for _ in seeds]
    screens = [e.reset(int(s)) for e, s in zip(envs, seeds, strict=True)]
    visited: list[list[dict]] = [[] for _ in seeds]
    live = list(range(len(envs)))
    while live:
        for i in live:
            visited[i].append({"screen": screens[i], "state": json.dumps(envs[i].state()),
                               "valid": json.dumps(envs[i].valid_actions()),
                               "task": envs[i].s["task"]})
        actions = act([screens[i] for i in live])
        nxt = []
        for i, a in zip(live, actions, strict=True):
            screens[i], _, done, _ = envs[i].step(a)
            if not done:
                nxt.append(i)
        live = nxt
    return envs, visited


def online_eval(act: Callable, episodes: int, seed: int) -> dict:
    """Online task success of ``act`` over ``episodes`` fresh episodes (seeds ``seed``,
    ``seed + 1``, ...): ``success`` overall and per task (``success/<task>``) and the mean
    ``steps`` of the successful episodes."""
    envs, _ = rollouts(act, range(seed, seed + episodes))
    ok = np.array([e.s["success"] for e in envs])
    out = {"success": float(ok.mean()),
           "steps": float(np.mean([e.s["steps"] for e in envs if e.s["success"]]))
           if ok.any() else float("nan")}
    for t in sorted({e.s["task"] for e in envs}):
        out[f"success/{t}"] = float(np.mean([e.s["success"] for e in envs
                                             if e.s["task"] == t]))
    return out


def online_source(tokenizer, mode: str, *, episodes: int, prompts_per_step: int,
                  max_new_tokens: int, width: int, seed: int = 0):
    """An online RL source for :meth:`lab.train.rl.RLTrainer.fit`: at RL step ``s`` the
    current policy (greedy) plays ``episodes`` fresh episodes (seeds drawn from ``(seed,
    s)``) and ``prompts_per_step`` of the states it visited are returned as rows
    ``{"prompt", "valid", "task"}`` (the rows are a pure function of the step and the
    model)."""
    def source(step: int, model) -> list[dict]:
        rng = np.random.default_rng([seed, step, 5])
        act = as_actions(lm_policy(model, tokenizer, mode, max_new_tokens=max_new_tokens,
                                   width=width, batch=episodes))
        _, visited = rollouts(act, rng.integers(10**6, 2 * 10**6, episodes).tolist())
        states = [v for ep in visited for v in ep]
        pick = rng.choice(len(states), min(prompts_per_step, len(states)), replace=False)
        return [{"prompt": prompt(states[i]["screen"], mode), "valid": states[i]["valid"],
                 "task": states[i]["task"]} for i in sorted(pick)]

    return source


@rewards.register("gui_valid", failure=0.0)
def gui_valid(prompts, completions, *, valid, **_) -> list[float | None]:
    """1 when the completion's action is one of the state's valid actions (``valid``: the
    JSON list), 0 for a wrong one; None (no answer) for a completion without a
    well-formed action line."""
    out = []
    for c, v in zip(completions, valid, strict=True):
        a = completion_action(c)
        out.append(None if parse_action(a) is None else float(a in json.loads(v)))
    return out
