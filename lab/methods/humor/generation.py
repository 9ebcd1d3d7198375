"""HUMOR's hierarchical multi-path generation, its CoT supervision traced back from the
ground-truth captions, the policy's SFT and sampling, path diversity, and the reward-model
reward for group-wise RL on ``lab.train.rl``.

The policy reads the VLM's reading of the image (:func:`prompt`: ``"scene <colour> intent
<shape>\\n"``, the words :func:`lab.methods.humor.perception.perceive` decodes) and writes
the fixed grammar of HUMOR's hierarchy, one parseable line per stage (HUMOR: "template
intent -> several reasoning paths -> anchored path -> caption")::

    intent loud
    path fire ball
    path leaf slice
    path wave oops
    anchor 1
    caption fire ball loud lol

``intent`` is the register of the joke (the tone), each ``path`` a candidate reasoning path
(a subject and a twist), ``anchor`` the 1-based index of the path the caption is built on,
``caption`` the caption. The single-path variant writes one path (``anchor 1``).

CoT supervision (:func:`trace_cot`) is traced back from a group's ground-truth caption
(the caption its noisy labels prefer most, :func:`lab.methods.humor.data.noisy_best`): the
intent is that caption's tone, the anchored path its subject and twist, the other paths
the subject-twist pairs of the group's other candidate captions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lab.data.batching import encode_sft, step_indices
from lab.methods.humor.data import (
    INTENTS,
    SCENES,
    SUBJECTS,
    TONES,
    TWISTS,
    parse_caption,
)
from lab.train import TrainConfig, Trainer, rewards, sft_loss

MODES = ("multi", "single")


def prompt(scene_word: str, intent_word: str) -> str:
    """The policy's prompt from the perceived scene and intent words."""
    return f"scene {scene_word} intent {intent_word}\n"


def format_cot(tone: str, paths: Sequence[tuple[str, str]], anchor: int, caption: str) -> str:
    """The completion text of one hierarchy (``anchor`` 1-based)."""
    if not 1 <= anchor <= len(paths):
        raise ValueError(f"anchor={anchor}; expected an index in [1, {len(paths)}]")
    return "\n".join([f"intent {tone}", *[f"path {s} {t}" for s, t in paths],
                      f"anchor {anchor}", f"caption {caption}"])


def parse_cot(text: str) -> dict | None:
    """``{"intent", "paths", "anchor", "caption"}`` of a completion in the grammar, None
    otherwise (a line out of order, an unknown word, an anchor outside the paths, a caption
    outside the caption grammar)."""
    lines = [ln.strip() for ln in text.strip().split("\n")]
    if len(lines) < 4:
        return None
    head, *mid, anchor, cap = lines
    hw, aw = head.split(), anchor.split()
    if len(hw) != 2 or hw[0] != "intent" or hw[1] not in TONES:
        return None
    paths = []
    for ln in mid:
        w = ln.split()
        if len(w) != 3 or w[0] != "path" or w[1] not in SUBJECTS or w[2] not in TWISTS:
            return None
        paths.append((w[1], w[2]))
    if len(aw) != 2 or aw[0] != "anchor" or not aw[1].isdigit() \
            or not 1 <= int(aw[1]) <= len(paths):
        return None
    if not cap.startswith("caption ") or parse_caption(cap[len("caption "):]) is None:
        return None
    return {"intent": hw[1], "paths": paths, "anchor": int(aw[1]),
            "caption": cap[len("caption "):].strip()}


def completion_caption(text: str) -> str | None:
    p = parse_cot(text)
    return None if p is None else p["caption"]


def trace_cot(best: str, others: Sequence[str], mode: str, n_paths: int,
              rng: np.random.Generator) -> str:
    """The CoT target traced back from the ground-truth caption ``best``: its tone as the
    intent, its subject-twist path anchored among ``n_paths - 1`` distinct other paths from
    the group's other captions ``others`` (``mode="multi"``), or alone (``"single"``)."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; expected one of {MODES}")
    p = parse_caption(best)
    if p is None:
        raise ValueError(f"best={best!r} is outside the caption grammar")
    gold = (SUBJECTS[p["subject"]], TWISTS[p["twist"]])
    paths = [gold]
    if mode == "multi":
        if n_paths < 2:
            raise ValueError(f"n_paths={n_paths}; expected >= 2 for mode='multi'")
        pool = []
        for c in others:
            q = parse_caption(c)
            path = (SUBJECTS[q["subject"]], TWISTS[q["twist"]])
            if path not in paths and path not in pool:
                pool.append(path)
        while len(pool) < n_paths - 1:    # a group with too few distinct others: draw more
            path = (SUBJECTS[int(rng.integers(len(SUBJECTS)))],
                    TWISTS[int(rng.integers(len(TWISTS)))])
            if path not in paths and path not in pool:
                pool.append(path)
        pick = rng.choice(len(pool), n_paths - 1, replace=False)
        paths += [pool[int(i)] for i in pick]
        order = rng.permutation(len(paths))
        paths = [paths[int(i)] for i in order]
    anchor = paths.index(gold) + 1
    return format_cot(TONES[p["tone"]], paths, anchor, best)


def sft_examples(groups: dict, words: Sequence[tuple[str, str]], best: Sequence[str],
                 mode: str, n_paths: int, seed: int = 0) -> list[dict]:
    """One ``{"prompt", "completion"}`` per group: the prompt from the perceived ``words``
    (scene, intent) of its image, the completion traced back from ``best[g]``."""
    rng = np.random.default_rng([seed, 31])
    out = []
    for g, (sw, iw) in enumerate(words):
        others = [c for c in groups["captions"][g] if c != best[g]]
        out.append({"prompt": prompt(sw, iw),
                    "completion": trace_cot(best[g], others, mode, n_paths, rng)})
    return out


def train_sft(model, tokenizer, examples: Sequence[dict], *, steps: int, batch_size: int,
              learning_rate: float, seq_len: int, warmup_steps: int = 20, seed: int = 0):
    """SFT of ``model`` on ``examples`` with :func:`lab.train.sft_loss` (AdamW, cosine);
    returns ``(model, history)``."""
    arrays = encode_sft(examples, tokenizer, seq_len)
    cfg = TrainConfig(steps=steps, learning_rate=learning_rate, warmup_steps=warmup_steps,
                      schedule="cosine", seed=seed, progress=False)
    n = len(examples)

    def batch_fn(step):
        idx = step_indices(n, batch_size, step, seed)
        return {k: v[idx] for k, v in arrays.items()}

    trainer = Trainer(model, sft_loss, cfg)
    model = trainer.fit(batch_fn)
    return model, trainer.history


def path_diversity(completions_by_template: dict[str, Sequence[str]]) -> dict:
    """Diversity of the reasoning paths: per template, every path line of every parsed
    completion is pooled; ``distinct_fraction`` is the mean over pairs of pooled paths of
    [the two differ] (0 when fewer than two paths), ``distinct`` the number of distinct
    paths; ``anchored_fraction`` is the same pair fraction over the anchored paths alone
    (one per completion: diversity across samples, which the multi-path targets do not
    give by construction). Returns the means over templates, the per-template values of
    both (``per_template``, ``per_template_anchored``) and the fraction of completions
    outside the grammar."""
    def differ(paths):
        k = len(paths)
        if k < 2:
            return 0.0
        _, cnt = np.unique(paths, return_counts=True)
        return 1.0 - float(np.sum(cnt * (cnt - 1))) / (k * (k - 1))

    per, anchored, counts, bad, total = {}, {}, {}, 0, 0
    for t, comps in completions_by_template.items():
        paths, anchors = [], []
        for c in comps:
            total += 1
            p = parse_cot(c)
            if p is None:
                bad += 1
                continue
            paths += [" ".join(x) for x in p["paths"]]
            anchors.append(" ".join(p["paths"][p["anchor"] - 1]))
        per[t], anchored[t] = differ(paths), differ(anchors)
        counts[t] = len(set(paths))
    if not per:
        raise ValueError("completions_by_template is empty; expected at least one template")
    return {"distinct_fraction": float(np.mean(list(per.values()))),
            "distinct": float(np.mean(list(counts.values()))), "per_template": per,
            "anchored_fraction": float(np.mean(list(anchored.values()))),
            "per_template_anchored": anchored,
            "malformed": bad / max(total, 1)}


def perceived_words(scene_probs: np.ndarray, intent_probs: np.ndarray) -> list[tuple[str, str]]:
    """The VLM's argmax scene and intent words per image."""
    return [(SCENES[int(s)], INTENTS[int(i)])
            for s, i in zip(scene_probs.argmax(-1), intent_probs.argmax(-1), strict=True)]


def register_rm_reward(rm, *, mean: float, std: float, clip: float,
                       name: str = "humor_rm") -> str:
    """Registers (replacing any earlier) reward ``name``: the reward model ``rm``'s score
    of the completion's caption on the row's image features (column ``features``, a list
    of floats), standardised by ``(mean, std)`` (the RM's scores on its training captions)
    and clipped to ``[-clip, clip]``; a completion outside the grammar is no answer (the
    failure reward ``-clip``). Returns ``name`` for :class:`lab.train.rl.RLConfig`."""
    from lab.methods.humor.reward_model import score_captions

    if not (np.isfinite(std) and std > 0):
        raise ValueError(f"std={std!r}; expected a finite number > 0")
    if not (np.isfinite(clip) and clip > 0):
        raise ValueError(f"clip={clip!r}; expected a finite number > 0")

    @rewards.register(name, failure=-float(clip))
    def rm_reward(prompts, completions, *, features, **_) -> list[float | None]:
        caps = [completion_caption(c) for c in completions]
        ok = [i for i, c in enumerate(caps) if c is not None]
        out: list[float | None] = [None] * len(completions)
        if ok:
            r = score_captions(rm, np.array([features[i] for i in ok], np.float32),
                               [caps[i] for i in ok])
            z = np.clip((r - mean) / std, -clip, clip)
            for i, v in zip(ok, z, strict=True):
                out[i] = float(v)
        return out

    return name
