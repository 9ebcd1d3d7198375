"""GridProbe experiment: accuracy vs GFLOPs of every frame selector on synthetic long-video
lookup questions, M_eff vs the generator's difficulty, and a small selector with a larger
QA model.

Models: the VLM zoo's ``config.small`` and ``config.large`` (``vlm-xs``, ``vlm-s``;
:func:`lab.zoo.load`, shipped with Lab), each wrapped as a
:class:`lab.methods.gridprobe.ZooReader`. Pairs (selector, QA): small/small, large/large and
small/large. Selectors (:data:`lab.methods.gridprobe.SELECTORS`): monolithic (all ``N``
frames), uniform ``M``, encoder-space similarity top ``M`` (mean visual token vs mean
question embedding), GridProbe's map with a fixed ``M``, and GridProbe with ``M_eff``;
``M`` of the fixed-budget baselines is the pair's mean ``M_eff`` rounded. Beside them:
the QA model with no frames (the question alone), with the evidence frames, and with
random frames, and a perfect-perception oracle on each selector's frames. Every row's
compute is :func:`lab.methods.gridprobe.forward_flops` per question, probes included.
A probe's confidence is its peak posterior (the paper's rule); ``--config.confidence=kl``
scores it by the KL divergence from the selector's posterior on the question alone.

With ``--config.model=<dir>`` (:func:`run_real`) the QA model (and the selector, unless
``--config.selector_model`` names another) is a Qwen3-VL checkpoint read by
:class:`lab.methods.gridprobe.QwenVLReader`, on Video-MME or LongVideoBench records over
extracted frames (``--config.records``, ``--config.frames_dir``): each question's frames as
images, or with ``--config.qwen_input=video`` as one Qwen3-VL video whose timestamps come
from the frames' indices at ``--config.frames_fps``, the rate they were extracted at.

  python -m experiments.gridprobe --config=configs/gridprobe.py:default --workdir=/tmp/gridprobe
"""

from __future__ import annotations

import os
import time

import numpy as np
from scipy import stats

from configs.gridprobe import get_config
from lab import launch, outputs, zoo
from lab.config import check, require
from lab.data import (
    load_frames,
    load_longvideobench,
    load_videomme,
    oracle_answer,
    render_videos,
    uniform_indices,
    video_qa,
)
from lab.methods import gridprobe as gp

PAIRS = (("small", "small"), ("large", "large"), ("small", "large"))

# Rules of the claims and the regime (fixed before the default run).
NEAR_MONOLITHIC = 0.05     # GridProbe within this accuracy of the monolithic pass
COMPUTE_FRACTION = 0.75    # ... at most this fraction of its GFLOPs
SE_MULT = 2.0              # a gain beyond this many standard errors
SPEARMAN_P = 0.05
REGIME_ABOVE_CHANCE = 0.15
REGIME_ABOVE_RANDOM = 0.10
REAL_READS = 0.05          # real path: all frames beat the question alone by this
BENCHMARKS = ("videomme", "longvideobench")
CONFIDENCE_TEXT = {"peak": "the peak posterior (the paper's rule)",
                   "kl": "the KL divergence from the selector's posterior on the question "
                         "alone"}
QWEN_INPUTS = ("images", "video")   # real path: a question's frames as images or one video


def check_config(config):
    check(config, get_config, {
        "k": (lambda v: v >= 1, "an int >= 1"),
        "rule": (lambda v: v in gp.RULES, f"one of {gp.RULES}"),
        "confidence": (lambda v: v in gp.CONFIDENCES, f"one of {gp.CONFIDENCES}"),
        "scale": (lambda v: v >= 0, "a float >= 0"),
        "m_min": (lambda v: v >= 1, "an int >= 1"),
        "m_max": (lambda v: v >= 0, "an int >= 0 (0 = K^2)"),
        "chunk": (lambda v: v >= 1, "an int >= 1"),
        "small": (lambda v: v in zoo.vlm.NAMED, f"a zoo VLM name, one of {sorted(zoo.vlm.NAMED)}"),
        "large": (lambda v: v in zoo.vlm.NAMED, f"a zoo VLM name, one of {sorted(zoo.vlm.NAMED)}"),
    })
    gp.check_grid_size(config.k, config.data.frames)
    require(config.benchmark in BENCHMARKS, "benchmark", config.benchmark, f"one of {BENCHMARKS}")
    require(config.qwen_input in QWEN_INPUTS, "qwen_input", config.qwen_input,
            f"one of {QWEN_INPUTS}")
    require(config.frames_fps > 0, "frames_fps", config.frames_fps,
            "the extracted frames' rate, frames per second > 0")
    for field in ("model", "selector_model"):
        require(not config[field] or os.path.isdir(config[field]), field, config[field],
                "'' (the zoo models) or a Qwen3-VL checkpoint directory")
    if config.model:
        for field in ("records", "frames_dir"):
            require(bool(config[field]), field, config[field],
                    f"the {config.benchmark} {field.replace('_', ' ')} path (--config.model "
                    "is set)")
    require(config.m_max == 0 or config.m_min <= config.m_max <= config.k ** 2, "m_max",
            config.m_max, f"0 or an int in [m_min, K^2={config.k ** 2}]")
    return config


def _encode(ds):
    return list(ds["question"]), [list(o) for o in ds["options"]], np.array(ds["answer_index"])


def _dataset(config, n, seed):
    d = config.data
    return video_qa(n, seed=seed, frames=d.frames, size=d.size, distractors=tuple(d.distractors),
                    question_types=d.question_types.split(","))


def models(config) -> dict:
    """The selector / QA models (``{"small", "large"}``): the zoo VLMs ``config.small`` and
    ``config.large`` (shipped, cached or trained by :func:`lab.zoo.load`)."""
    out = {}
    for size in ("small", "large"):
        model, tokenizer = zoo.load(config[size], source=config.source)
        out[size] = gp.ZooReader(model, tokenizer)
    return out


def _acc(pred, answer) -> tuple[float, float]:
    hit = (np.asarray(pred) == np.asarray(answer)).astype(np.float64)
    return float(hit.mean()), float(hit.std(ddof=1) / np.sqrt(len(hit))) if len(hit) > 1 else 0.0


def _paired_se(a, b, answer) -> float:
    d = (np.asarray(a) == answer).astype(float) - (np.asarray(b) == answer).astype(float)
    return float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0


def paired_gains(preds: dict, answer, pairs) -> dict:
    """Per pair: GridProbe's accuracy gain over uniform selection at the same mean M, and
    for ``small/large`` (when it ran) over the small model alone, each with its paired SE."""
    a, out = answer, {}
    for pair in pairs:
        g, u = preds[(pair, "gridprobe")], preds[(pair, "uniform")]
        out[pair] = {"gain_uniform": float(np.mean(g == a) - np.mean(u == a)),
                     "se_uniform": _paired_se(g, u, a)}
    if "small/large" in out:
        s, gl = preds[("small/small", "gridprobe")], preds[("small/large", "gridprobe")]
        out["small/large"].update(gain_small=float(np.mean(gl == a) - np.mean(s == a)),
                                  se_small=_paired_se(gl, s, a))
    return out


def m_eff_spearman(m_eff, difficulty) -> dict:
    """Spearman's rho of ``M_eff`` against the difficulty, with its p-value (rho 0, p 1
    when either is constant: the correlation is undefined)."""
    m_eff, difficulty = np.asarray(m_eff), np.asarray(difficulty)
    if len(set(difficulty.tolist())) < 2 or np.ptp(m_eff) == 0:
        return {"rho": 0.0, "p": 1.0, "n": len(difficulty)}
    rho, p = stats.spearmanr(m_eff, difficulty)
    return {"rho": float(np.nan_to_num(rho)), "p": float(np.nan_to_num(p, nan=1.0)),
            "n": len(difficulty)}


def selector_masks(config, imp, frame_emb, query_emb) -> tuple[dict, np.ndarray, int]:
    """Every selector's frame masks ``[B, K^2]`` from the selector's importance maps ``imp``
    and its frame / question embeddings; ``M_eff`` per question and the fixed ``M`` of the
    baselines (the mean ``M_eff`` rounded)."""
    n, b = config.k ** 2, len(imp)
    m_max = config.m_max or None
    m_eff = np.asarray(gp.select_m(imp, config.rule, scale=config.scale, m_min=config.m_min,
                                   m_max=m_max))
    m_fix = int(np.clip(round(float(m_eff.mean())), 1, n))
    masks = {
        "monolithic": gp.select("monolithic", n=n, batch=b),
        "uniform": gp.select("uniform", n=n, m=m_fix, batch=b),
        "similarity": gp.select("similarity", n=n, m=m_fix, frame_emb=frame_emb,
                                query_emb=query_emb),
        "gridprobe_fixed": gp.select("gridprobe_fixed", n=n, m=m_fix, importance=imp),
        "gridprobe": gp.select("gridprobe", n=n, importance=imp, rule=config.rule,
                               scale=config.scale, m_min=config.m_min, m_max=m_max),
    }
    return masks, m_eff, m_fix


def evaluate(config, vlms: dict, ds, videos) -> dict:
    """Every selector of every pair on ``ds`` (``videos``: the grid's frames)."""
    k, n, size = config.k, config.k ** 2, config.data.size
    q, o, a = _encode(ds)
    b, nopt = len(q), len(o[0])
    grid = gp.grid_frames(config.data.frames, k)
    rows, preds, extra = [], {}, {}
    rng = np.random.default_rng(config.seed + 11)
    flops_of = {s: {m: vlms[s].forward_flops(m, size, nopt) for m in range(1, n + 1)}
                for s in vlms}
    # 2K probes of K frames; with KL confidences also the question alone
    probe_cost = {s: 2 * k * flops_of[s][k] + (vlms[s].forward_flops(0, size, nopt)
                                               if config.confidence == "kl" else 0)
                  for s in vlms}
    vision_cost = {s: vlms[s].vision_flops(n, size) for s in vlms}
    probes = {s: gp.probe(vlms[s], videos, q, o, k, chunk=config.chunk,
                          confidence=config.confidence) for s in vlms}
    emb = {s: (vlms[s].frame_embeddings(videos, chunk=config.chunk),
               vlms[s].question_embeddings(q)) for s in vlms}

    def oracle(mask):
        r = np.random.default_rng(config.seed + 5)
        return [oracle_answer(ds[i], grid[np.flatnonzero(mask[i])].tolist(), r) for i in range(b)]

    for sel, qa in PAIRS:
        pair = f"{sel}/{qa}"
        masks, m_eff, m_fix = selector_masks(config, probes[sel]["map"], *emb[sel])
        for name, mask in masks.items():
            if name == "monolithic" and sel != qa:
                continue                     # the monolithic pass has no selector
            post = vlms[qa].posteriors(videos, mask, q, o, chunk=config.chunk)
            pred = post.argmax(1)
            acc, se = _acc(pred, a)
            count = mask.sum(1)
            qa_flops = np.mean([flops_of[qa][int(c)] for c in count])
            sel_flops = {"monolithic": 0, "uniform": 0, "similarity": vision_cost[sel]}.get(
                name, probe_cost[sel])
            preds[(pair, name)] = pred
            rows.append({"pair": pair, "selector": name, "accuracy": acc, "se": se,
                         "frames": float(count.mean()),
                         "gflops": (qa_flops + sel_flops) / 1e9,
                         "oracle_accuracy": _acc(oracle(mask), a)[0]})
        extra[pair] = {"m_eff": m_eff.tolist(), "m_fixed": m_fix}
    # the QA models with no frames, the evidence frames and random frames (the regime)
    ev = np.zeros((b, n), bool)
    for i, f in enumerate(ds["evidence_frames"]):
        ev[i, [int(j) for j in np.flatnonzero(np.isin(grid, f))]] = True
    count = np.maximum(ev.sum(1), 1)
    rand = np.zeros_like(ev)
    for i in range(b):
        rand[i, rng.choice(n, int(count[i]), replace=False)] = True
    none = np.zeros_like(ev)
    context = {}
    for s in vlms:
        context[s] = {name: _acc(vlms[s].posteriors(videos, m, q, o, chunk=config.chunk)
                                 .argmax(1), a)
                      for name, m in (("evidence", ev), ("random", rand), ("no_frames", none))}
    return {"rows": rows, "preds": preds, "extra": extra, "context": context,
            "probes": probes, "evidence_mask": ev, "answer": a}


def claims_of(results: dict) -> list[dict]:
    """The claims, decided by rules on measured numbers (see the module constants)."""
    rows = {(r["pair"], r["selector"]): r for r in results["table"]}
    out = []
    mono = rows.get(("large/large", "monolithic"))
    gpl = rows.get(("small/large", "gridprobe"))
    if mono and gpl:
        frac = gpl["gflops"] / mono["gflops"]
        gap = mono["accuracy"] - gpl["accuracy"]
        out.append(outputs.claim(
            f"GridProbe (small selector, large QA) is within {NEAR_MONOLITHIC} of the large "
            f"model's monolithic accuracy at <= {COMPUTE_FRACTION} of its GFLOPs",
            "accuracy gap (monolithic - GridProbe), compute fraction",
            {"gap": gap, "fraction": frac},
            gap <= NEAR_MONOLITHIC and frac <= COMPUTE_FRACTION))
    for pair in ("small/small", "large/large", "small/large"):
        g, u = rows.get((pair, "gridprobe")), rows.get((pair, "uniform"))
        d = results.get("paired", {}).get(pair)
        if g and u and d:
            out.append(outputs.claim(
                f"GridProbe beats uniform selection at the same mean M ({pair})",
                "accuracy gain over uniform, paired SE",
                {"gain": d["gain_uniform"], "se": d["se_uniform"]},
                d["gain_uniform"] > SE_MULT * d["se_uniform"] and d["gain_uniform"] > 0))
    sp = results.get("spearman")
    if sp:
        what = results.get("difficulty", "the generator's difficulty")
        out.append(outputs.claim(
            f"M_eff rises with {what} (Spearman rho > 0, p < {SPEARMAN_P})",
            "Spearman rho, p", sp, sp["rho"] > 0 and sp["p"] < SPEARMAN_P))
    gs, gl = rows.get(("small/small", "gridprobe")), rows.get(("small/large", "gridprobe"))
    d = results.get("paired", {}).get("small/large")
    if gs and gl and d:
        out.append(outputs.claim(
            "A small selector with the larger QA model beats the small model alone "
            f"(GridProbe, gain > {SE_MULT} paired SE)", "accuracy gain, paired SE",
            {"gain": d["gain_small"], "se": d["se_small"]},
            d["gain_small"] > SE_MULT * d["se_small"] and d["gain_small"] > 0))
    return out


def regime_of(results: dict) -> list[dict]:
    """The synthetic path: each QA model reads the evidence frames. The real path: the QA
    model with all frames beats the question alone by REAL_READS."""
    if "real" in results:
        return [outputs.regime(
            f"the {s} QA model reads the videos: with all K^2 frames >= {REAL_READS} above the "
            "question alone", r, r["all_frames"] is not None
            and r["all_frames"] >= r["no_frames"] + REAL_READS)
            for s, r in results["real"]["reads"].items()]
    out = []
    chance = results["chance"]
    for s, ctx in results["context"].items():
        ev, rnd = ctx["evidence"][0], ctx["random"][0]
        out.append(outputs.regime(
            f"the {s} QA model with the evidence frames is >= chance + {REGIME_ABOVE_CHANCE} "
            f"and >= its accuracy with as many random frames + {REGIME_ABOVE_RANDOM}",
            {"evidence": ev, "random": rnd, "chance": chance},
            ev >= chance + REGIME_ABOVE_CHANCE and ev >= rnd + REGIME_ABOVE_RANDOM))
    return out


def run(config, workdir: str) -> dict:
    """Trains (or loads) the two VLMs, evaluates every selector, writes the outputs
    (:func:`run_real` when ``config.model`` names a Qwen3-VL directory)."""
    check_config(config)
    if config.model:
        return run_real(config, workdir)
    t0 = time.time()
    vlms = models(config)
    ds = _dataset(config, config.data.n_eval, config.seed + 1)
    grid = gp.grid_frames(config.data.frames, config.k)
    videos = render_videos(ds)[:, grid]
    ev = evaluate(config, vlms, ds, videos)
    paired = paired_gains(ev["preds"], ev["answer"], [f"{s}/{q}" for s, q in PAIRS])
    m_eff = np.asarray(ev["extra"]["small/large"]["m_eff"])
    diff = np.asarray(ds["difficulty"])
    spearman = m_eff_spearman(m_eff, diff)
    by_diff = {int(d): float(m_eff[diff == d].mean()) for d in sorted(set(diff.tolist()))}
    results = {"table": ev["rows"], "paired": paired, "spearman": spearman,
               "m_eff_by_difficulty": by_diff, "context": ev["context"],
               "chance": 1.0 / len(ds[0]["options"]),
               "models": {s: config[s] for s in ("small", "large")},
               "confidence": config.confidence,
               "fixed_m": {p_: e["m_fixed"] for p_, e in ev["extra"].items()}}
    results["claims"] = claims_of(results)
    results["regime"] = regime_of(results)
    results["seconds"] = time.time() - t0
    plots = [_plot(ev, ds, grid, config, workdir)]
    report = [f"Probe confidence: {CONFIDENCE_TEXT[config.confidence]}.\n",
              "## Accuracy vs compute\n",
              outputs.markdown_table(ev["rows"]), "\n",
              "## QA model with no / evidence / random frames\n",
              outputs.markdown_table([{"model": s, **{k_: v[0] for k_, v in c.items()}}
                                      for s, c in ev["context"].items()]), "\n",
              f"## M_eff vs difficulty (small selector)\n\nSpearman rho {spearman['rho']:.3f}, "
              f"p {spearman['p']:.3g}, n {spearman['n']}; mean M_eff by difficulty: "
              f"{by_diff}\n"]
    return outputs.write_outputs(workdir, name="gridprobe", config=config, results=results,
                                 report="\n".join(report), plots=plots)


# The real path: Qwen3-VL checkpoints on Video-MME / LongVideoBench over extracted frames.

def real_models(config) -> dict:
    """``{"small": selector, "large": QA model}`` as :class:`lab.methods.gridprobe.QwenVLReader`
    (one reader in both roles when ``selector_model`` is empty or the same directory)."""
    video = config.qwen_input == "video"
    large = gp.QwenVLReader.from_pretrained(config.model, video=video)
    same = not config.selector_model or os.path.samefile(config.selector_model, config.model)
    return {"small": large if same else gp.QwenVLReader.from_pretrained(config.selector_model,
                                                                        video=video),
            "large": large}


def real_dataset(config):
    """The benchmark's answered questions (the first ``data.n_eval``); ValueError naming the
    video when it has fewer extracted frames than the grid's ``K^2``."""
    load = load_videomme if config.benchmark == "videomme" else load_longvideobench
    ds = load(config.records, config.frames_dir)
    ds = ds.select([i for i, a in enumerate(ds["answer_index"]) if a >= 0][:config.data.n_eval])
    if not len(ds):
        raise ValueError(f"records={config.records!r} holds no question with a known answer")
    n = config.k ** 2
    for vid, count in zip(ds["video_id"], ds["n_frames"], strict=True):
        if count < n:
            raise ValueError(f"video {vid!r} has {count} extracted frames; a K={config.k} grid "
                             f"needs K^2={n} (extract more frames or lower --config.k)")
    return ds


def _real_frames(row, n: int, fps: float) -> tuple[np.ndarray, np.ndarray]:
    """``uint8 [1, n, H, W, 3]``: ``n`` frames at the midpoints of equal segments, and their
    seconds ``[1, n]`` (index over the extraction rate ``fps``)."""
    idx = uniform_indices(row["n_frames"], n)
    return load_frames(row["frame_paths"], idx)[None], (idx / fps)[None]


def run_real(config, workdir: str) -> dict:
    """GridProbe and the baselines with Qwen3-VL checkpoints on benchmark records. Two
    passes over the questions (frames read from disk in each): the probes and embeddings of
    every question, then every selector's frames answered by the QA model, beside the
    question alone. Pairs: selector/QA as in :data:`PAIRS` with two models, ``large/large``
    with one. Difficulty for the M_eff correlation: Video-MME's duration class (short /
    medium / long) or LongVideoBench's duration group."""
    t0 = time.time()
    vlms = real_models(config)
    ds = real_dataset(config)
    k, n = config.k, config.k ** 2
    q, o, a = _encode(ds)
    b = len(q)
    pairs = PAIRS if vlms["small"] is not vlms["large"] else (("large", "large"),)
    sels = sorted({s for s, _ in pairs})
    maps = {s: np.zeros((b, n), np.float32) for s in sels}
    femb = {s: [] for s in sels}
    for i in range(b):
        v, t = _real_frames(ds[i], n, config.frames_fps)
        for s in sels:
            maps[s][i] = gp.probe(vlms[s], v, [q[i]], [o[i]], k, times=t,
                                  confidence=config.confidence)["map"][0]
            femb[s].append(vlms[s].frame_embeddings(v)[0])
    selection = {f"{s}/{qa}": selector_masks(config, maps[s], np.stack(femb[s]),
                                             vlms[s].question_embeddings(q))
                 for s, qa in pairs}
    preds = {(p, name): np.zeros(b, np.int64) for p, (masks, _, _) in selection.items()
             for name in masks if name != "monolithic" or p.split("/")[0] == p.split("/")[1]}
    flops = {key: np.zeros(b) for key in preds}
    alone = {qa: np.zeros(b, np.int64) for _, qa in pairs}
    for i in range(b):
        v, t = _real_frames(ds[i], n, config.frames_fps)
        h, w = v.shape[2:4]
        for qa in alone:
            none = np.zeros((1, n), bool)
            alone[qa][i] = vlms[qa].posteriors(v, none, [q[i]], [o[i]])[0].argmax()
        for p, name in preds:
            sel, qa = p.split("/")
            mask = selection[p][0][name][i:i + 1]
            preds[(p, name)][i] = vlms[qa].posteriors(v, mask, [q[i]], [o[i]],
                                                      times=t)[0].argmax()
            nopt = len(o[i])
            sel_flops = {"monolithic": 0, "uniform": 0}.get(name)
            if sel_flops is None and name == "similarity":
                sel_flops = vlms[sel].vision_flops(n, h, width=w)
            elif sel_flops is None:
                sel_flops = 2 * k * vlms[sel].forward_flops(k, h, nopt, width=w)
                if config.confidence == "kl":
                    sel_flops += vlms[sel].forward_flops(0, h, nopt, width=w)
            flops[(p, name)][i] = sel_flops + vlms[qa].forward_flops(int(mask.sum()), h, nopt,
                                                                     width=w)
    rows = []
    for (p, name), pred in preds.items():
        acc, se = _acc(pred, a)
        rows.append({"pair": p, "selector": name, "accuracy": acc, "se": se,
                     "frames": float(selection[p][0][name].sum(1).mean()),
                     "gflops": float(flops[(p, name)].mean() / 1e9)})
    paired = paired_gains(preds, a, list(selection))
    m_eff = selection["small/large" if "small/large" in selection else "large/large"][1]
    diff = np.asarray(ds["difficulty"])
    spearman = m_eff_spearman(m_eff, diff)
    reads = {qa: {"all_frames": _acc(preds[(f"{qa}/{qa}", "monolithic")], a)[0]
                  if (f"{qa}/{qa}", "monolithic") in preds else None,
                  "no_frames": _acc(alone[qa], a)[0]} for qa in alone}
    results = {"table": rows, "paired": paired, "spearman": spearman,
               "difficulty": f"the {config.benchmark} duration class",
               "real": {"benchmark": config.benchmark, "n": b, "reads": reads,
                        "input": config.qwen_input, "confidence": config.confidence,
                        "models": {"small": config.selector_model or config.model,
                                   "large": config.model}},
               "m_eff_by_difficulty": {int(d): float(m_eff[diff == d].mean())
                                       for d in sorted(set(diff.tolist()))},
               "chance": float(np.mean([1.0 / len(x) for x in o])),
               "fixed_m": {p: sel_[2] for p, sel_ in selection.items()}}
    results["claims"] = claims_of(results)
    results["regime"] = regime_of(results)
    results["seconds"] = time.time() - t0
    given = ("images, one per frame" if config.qwen_input == "images" else
             f"one video, timestamped at {config.frames_fps:g} extracted frames per second")
    report = [f"{config.benchmark}, {b} questions; each question's frames given to Qwen3-VL as "
              f"{given}. Probe confidence: {CONFIDENCE_TEXT[config.confidence]}.\n",
              "## Accuracy vs compute\n", outputs.markdown_table(rows), "\n",
              "## The QA model with all frames / the question alone\n",
              outputs.markdown_table([{"model": s, **r} for s, r in reads.items()]), "\n",
              f"## M_eff vs {results['difficulty']}\n\nSpearman rho {spearman['rho']:.3f}, "
              f"p {spearman['p']:.3g}, n {b}\n"]
    return outputs.write_outputs(workdir, name="gridprobe", config=config, results=results,
                                 report="\n".join(report), plots=[])


def main_table(results) -> list[dict]:
    """One row per (selector, QA) pair and selector: accuracy, SE, frames, GFLOPs."""
    return [{k: r[k] for k in ("pair", "selector", "accuracy", "se", "frames", "gflops")}
            for r in results["table"]]


def _plot(ev, ds, grid, config, workdir) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = config.k
    show = min(6, len(ds))
    fig, axes = plt.subplots(1, show, figsize=(2.2 * show, 2.4))
    axes = np.atleast_1d(axes)
    maps = ev["probes"]["small"]["map"]
    for i in range(show):
        ax = axes[i]
        ax.imshow(maps[i].reshape(k, k), cmap="viridis")
        for slot in np.flatnonzero(ev["evidence_mask"][i]):
            ax.add_patch(plt.Rectangle((slot % k - 0.5, slot // k - 0.5), 1, 1, fill=False,
                                       edgecolor="red", linewidth=2))
        ax.set_title(f"difficulty {ds[i]['difficulty']}", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle("importance maps (small selector); red: evidence frames", fontsize=9)
    return outputs.save_figure(fig, workdir, "importance_maps.png")


if __name__ == "__main__":
    launch.main(run)
