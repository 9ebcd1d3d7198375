"""Running a collaboration graph on a batch of problems with a pool of chain-of-thought LMs.

The roles, all from the pool's own models (no gold answer inside a graph):

- ``solver``: samples a chain for the problem's prompt (``"49+18-30=?\\n"``, the reasoning
  zoo's format) at ``solver_temperature``;
- ``critic``: picks one incoming chain (the confidence-weighted vote below, under its own
  model) and flags its least-confident step: the step whose lowest token log-probability
  under the critic's model is smallest (self-evaluation by likelihood);
- ``refiner``: picks an incoming chain the same way, takes the flag of the critic that
  produced it (or flags it itself, under its own model), and resamples the chain from the
  flagged step on, conditioned on the earlier steps (prompt + prefix, the task's format),
  at ``refiner_temperature``; with ``accept="confidence"`` it keeps the new chain only when
  its mean token log-probability under the refiner's model is at least the old one's;
- ``aggregator``: a vote over incoming answers, each chain weighted by its confidence
  ``exp(mean token log-prob)`` under the aggregator's model (``vote="confidence"``), or one
  vote each (``"majority"``, no LM call); it passes on the winning answer's most confident
  chain.

Confidence needs a chain's token log-probabilities under a model; they come free from
generation when that model wrote the chain, otherwise from one scoring call
(:func:`lab.infer.score`).

Cost: FLOPs are analytic (:func:`lab.nn.flops.transformer_flops`, causal attention count):
a call's forward over the tokens it processes, a generation's prompt plus generated tokens
(KV-cached decoding computes the same products as one causal forward over them), a scoring
call's input; the graph's FLOPs per problem sum its nodes'. Latency is measured: the wall
time of each node's batched call, and the graph's latency is its critical path (nodes of a
layer run in parallel). Node calls are cached by what determines them (role, model, parents'
keys, problems, and the occurrence index among identical sampled nodes), so a node repeated
across graphs is computed once; its FLOPs and latency are charged to every graph that uses it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
import zlib
from collections.abc import Sequence

import numpy as np

from lab import infer
from lab.data.synthetic.arithmetic import parse_answer
from lab.methods.agent_reinforce.graph import CollaborationGraph
from lab.nn.flops import transformer_flops

VOTES = ("confidence", "majority")
ACCEPTS = ("confidence", "always")


class ModelPool:
    """Models of one tokenizer (a byte-level one: one token per character), by name.
    ``ModelPool.from_zoo(["cot-xs", "cot-s", "cot-m"])`` loads the reasoning zoo."""

    def __init__(self, names: Sequence[str], models: Sequence, tokenizer):
        names, models = list(names), list(models)
        if not names:
            raise ValueError("pool names=[]; expected a non-empty model pool")
        if len(names) != len(models):
            raise ValueError(f"{len(names)} names for {len(models)} models")
        if len(tokenizer.encode("49+18=67;")) != 9:
            raise ValueError("the pool's tokenizer is not byte-level (one token per "
                             "character), which the step spans need")
        self.names, self.models, self.tokenizer = names, models, tokenizer
        self.params = [int(sum(np.prod(x.shape) for x in _leaves(m))) for m in models]
        self.max_len = min(m.config.max_len for m in models)
        self._table = [np.array([0] + [transformer_flops(m.config, 1, t, attention="causal")
                                       ["total"] for t in range(1, self.max_len + 1)])
                       for m in models]

    @classmethod
    def from_zoo(cls, names: Sequence[str]) -> ModelPool:
        from lab import zoo

        names = list(names)
        if not names:
            raise ValueError("pool names=[]; expected a non-empty model pool")
        loaded = [zoo.load(n) for n in names]
        return cls(names, [m for m, _ in loaded], loaded[0][1])

    def __len__(self) -> int:
        return len(self.names)

    def flops(self, model: int, tokens: int) -> int:
        """Forward FLOPs of one row of ``tokens`` tokens through ``model`` (causal)."""
        return int(self._table[model][min(int(tokens), self.max_len)])

    def largest(self) -> int:
        return int(np.argmax(self.params))

    def smallest(self) -> int:
        return int(np.argmin(self.params))


def _leaves(model):
    import jax
    from flax import nnx

    return jax.tree_util.tree_leaves(nnx.state(model, nnx.Param))


@dataclasses.dataclass
class Problems:
    """A batch: ``prompts`` (the task's format) and the gold ``answers`` (used only to
    score the graph's output and its nodes' outcomes, never inside a graph)."""

    prompts: list[str]
    answers: list[int]
    key: str = ""

    def __post_init__(self):
        if not self.prompts:
            raise ValueError("Problems.prompts is empty; expected at least one problem")
        if len(self.prompts) != len(self.answers):
            raise ValueError(f"{len(self.prompts)} prompts for {len(self.answers)} answers")
        self.answers = [int(a) for a in self.answers]
        if not self.key:
            self.key = hashlib.sha1("\x00".join(self.prompts).encode()).hexdigest()[:12]

    @classmethod
    def from_dataset(cls, ds) -> Problems:
        return cls(list(ds["prompt"]), [int(a) for a in ds["answer"]])

    def __len__(self) -> int:
        return len(self.prompts)


@dataclasses.dataclass
class Chains:
    """One chain per problem: ``texts`` (completion without EOS), ``answers`` (parsed,
    None when malformed), token log-probabilities per model index (``lp[m][i]``: the
    chain's tokens then EOS) as known to the node that made them, critic ``flags`` (step
    index per problem) or None, and the making node's cache ``key``."""

    texts: list[str]
    answers: list
    lp: dict
    flags: list | None = None
    key: str = ""


@dataclasses.dataclass(frozen=True)
class NodeOutcome:
    """What the executor saw at one node: its role and model, the accuracy of its answers,
    its FLOPs per problem, its measured latency, and its parents' indices."""

    index: int
    role: str
    model: int
    parents: tuple
    accuracy: float
    flops: float
    latency: float


@dataclasses.dataclass(frozen=True)
class Result:
    """A graph's outcome on a batch: ``accuracy``, ``flops`` (per problem), ``latency``
    (seconds, critical path), ``nodes`` (:class:`NodeOutcome` per executed node) and the
    output's answers."""

    accuracy: float
    flops: float
    latency: float
    nodes: tuple
    answers: tuple


def step_spans(text: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of a chain's steps (each with its separator) on the
    first line; the answer line is not a step. An empty chain gives one span, the whole
    text (so a flag always exists)."""
    line_end = text.find("\n")
    line_end = len(text) if line_end < 0 else line_end
    spans, start = [], 0
    for k, ch in enumerate(text[:line_end + 1]):
        if ch in ";\n" or k == line_end:
            end = k + 1 if ch in ";\n" else k
            if end > start:
                spans.append((start, end))
            start = k + 1
    return spans or [(0, max(len(text), 1))]


def least_confident_step(text: str, lp: np.ndarray) -> int:
    """Index of the step whose lowest token log-probability is the smallest."""
    spans = step_spans(text)
    worst = [float(np.min(lp[s:e])) if e <= len(lp) and e > s else 0.0 for s, e in spans]
    return int(np.argmin(worst))


def confidence(lp: np.ndarray) -> float:
    return float(np.mean(lp)) if len(lp) else -np.inf


def vote(answers: Sequence, weights: Sequence[float]) -> int | None:
    """The answer with the largest total weight (None answers ignored unless all are None;
    ties to the first seen); returns the index of the winning answer's heaviest chain."""
    tot: dict = {}
    for a, w in zip(answers, weights, strict=True):
        if a is not None:
            tot[a] = tot.get(a, 0.0) + w
    if not tot:
        return int(np.argmax(weights))
    win = max(tot, key=tot.get)
    cands = [k for k, a in enumerate(answers) if a == win]
    return max(cands, key=lambda k: weights[k])


class Executor:
    """Runs :class:`CollaborationGraph` s on :class:`Problems` with a :class:`ModelPool`.

    ``buckets``: ``((width, max_new), ...)`` generation shapes (padded prompt width, new
    tokens); a prompt goes to the first bucket it fits, so each model compiles a few shapes
    only. ``seed`` mixes into every sampled node's seed. ``warmup()`` compiles every shape
    before latencies are measured.
    """

    def __init__(self, pool: ModelPool, *, solver_temperature: float = 1.0,
                 refiner_temperature: float = 0.05, vote: str = "confidence",
                 accept: str = "confidence", buckets=((56, 72), (88, 40)), rows: int = 64,
                 seed: int = 0):
        if len(pool) < 1:
            raise ValueError("pool is empty; expected a non-empty model pool")
        if vote not in VOTES:
            raise ValueError(f"vote={vote!r}; expected one of {VOTES}")
        if accept not in ACCEPTS:
            raise ValueError(f"accept={accept!r}; expected one of {ACCEPTS}")
        for w, n in buckets:
            if w + n > pool.max_len:
                raise ValueError(f"bucket (width={w}, max_new={n}) exceeds the pool's "
                                 f"max_len={pool.max_len}")
        self.pool, self.vote, self.accept = pool, vote, accept
        self.solver_temperature = float(solver_temperature)
        self.refiner_temperature = float(refiner_temperature)
        self.buckets, self.rows, self.seed = tuple(buckets), int(rows), int(seed)
        self.tok = pool.tokenizer
        self.cache: dict = {}
        self._scores: dict = {}
        self.stats = {"node_calls": 0, "cache_hits": 0, "generate_calls": 0,
                      "score_calls": 0, "seconds": 0.0}

    # -- LM calls
    def _generate(self, m: int, texts: Sequence[str], temperature: float, seed: int):
        """Continuations of ``texts`` (BOS + text); rows that fit no bucket get None."""
        model, tok = self.pool.models[m], self.tok
        ids = [tok.encode(t, add_bos=True) for t in texts]
        out: list = [None] * len(ids)
        flops = 0
        for b, (width, max_new) in enumerate(self.buckets):
            lo = self.buckets[b - 1][0] if b else 0
            rows = [i for i, x in enumerate(ids) if lo < len(x) <= width]
            for start in range(0, len(rows), self.rows):
                chunk = rows[start:start + self.rows]
                batch = np.full((self.rows, width), tok.pad_id, np.int32)
                lens = np.ones(self.rows, np.int32)
                for r, i in enumerate(chunk):
                    batch[r, :len(ids[i])], lens[r] = ids[i], len(ids[i])
                for r in range(len(chunk), self.rows):
                    batch[r, :len(ids[chunk[0]])], lens[r] = ids[chunk[0]], len(ids[chunk[0]])
                g = infer.generate(model, batch, lengths=lens, max_new_tokens=max_new,
                                   temperature=temperature, stop_tokens=(tok.eos_id,),
                                   seed=seed + 7919 * b + start, pad_id=tok.pad_id,
                                   capacity=width + max_new)
                self.stats["generate_calls"] += 1
                toks, lps = np.asarray(g.tokens), np.asarray(g.logprobs)
                glen = np.asarray(g.lengths)
                for r, i in enumerate(chunk):
                    n = int(glen[r])
                    row = toks[r, :n].tolist()
                    text_ids = row[:-1] if row and row[-1] == tok.eos_id else row
                    out[i] = (tok.decode(text_ids), lps[r, :n].astype(np.float64))
                    flops += self.pool.flops(m, len(ids[i]) + n)
        return out, flops

    def _score(self, m: int, prompts: Sequence[str], texts: Sequence[str]):
        """Token log-probabilities of each chain (then EOS) after BOS + prompt."""
        tok, width = self.tok, self.pool.max_len
        seqs = [(tok.encode(p, add_bos=True), tok.encode(t) + [tok.eos_id])
                for p, t in zip(prompts, texts, strict=True)]
        seqs = [(a, b[:width + 1 - len(a)]) for a, b in seqs]
        out, flops = [], 0
        for start in range(0, len(seqs), self.rows):
            chunk = seqs[start:start + self.rows]
            x = np.full((self.rows, width), tok.pad_id, np.int32)
            y = np.full((self.rows, width), tok.pad_id, np.int32)
            mask = np.zeros((self.rows, width), bool)
            for r, (a, b) in enumerate(chunk):
                s = a + b
                x[r, :len(s) - 1], y[r, :len(s) - 1], mask[r, :len(s) - 1] = s[:-1], s[1:], True
            lp = np.asarray(infer.score(self.pool.models[m], x, y, mask=mask), np.float64)
            self.stats["score_calls"] += 1
            for r, (a, b) in enumerate(chunk):
                out.append(lp[r, len(a) - 1:len(a) - 1 + len(b)])
                flops += self.pool.flops(m, len(a) + len(b) - 1)
        return out, flops

    def warmup(self) -> float:
        """Compiles every model's generation buckets and scoring shape; returns seconds."""
        t = time.perf_counter()
        for m in range(len(self.pool)):
            for width, _ in self.buckets:
                for temp in {self.solver_temperature, self.refiner_temperature}:
                    self._generate(m, ["1" * (width - 1)], temp, 0)
            self._score(m, ["1+1=?\n"], ["1+1=2\nA: 2"])
        return time.perf_counter() - t

    # -- roles
    def _lp(self, m: int, problems: Problems, ch: Chains):
        """``(lp, flops)``: the chains' token log-probabilities under model ``m``, free when
        they came with the chain (the node that made it ran ``m``), else one scoring call,
        computed once and charged to every node that asks."""
        if m in ch.lp:
            return ch.lp[m], 0
        k = (ch.key, m)
        if k not in self._scores:
            self._scores[k] = self._score(m, problems.prompts, ch.texts)
        return self._scores[k]

    def _select(self, m: int, problems: Problems, parents: list[Chains], weighted: bool):
        """Per problem, the parent index the vote picks under model ``m``, the parents'
        log-probabilities under ``m`` (None unweighted) and the FLOPs spent on them."""
        flops, lps = 0, None
        if weighted:
            lps = []
            for ch in parents:
                lp, f = self._lp(m, problems, ch)
                lps.append(lp)
                flops += f
        pick = []
        for i in range(len(problems)):
            answers = [ch.answers[i] for ch in parents]
            w = ([np.exp(confidence(lp[i])) for lp in lps] if weighted
                 else [1.0] * len(parents))
            pick.append(vote(answers, w) if len(parents) > 1 else 0)
        return pick, lps, flops

    def _node(self, graph: CollaborationGraph, idx: int, problems: Problems,
              outs: dict, key: str):
        node = graph.nodes[idx]
        m, role = node.model, node.role
        parents = [outs[p] for p in node.parents]
        n = len(problems)
        if role == "solver":
            seed = zlib.crc32(f"{key}|{self.seed}".encode()) % (2**31 - 1)
            res, flops = self._generate(m, problems.prompts, self.solver_temperature, seed)
            texts = [r[0] if r else "" for r in res]
            return Chains(texts, [parse_answer(t) for t in texts],
                          {m: [r[1] if r else np.zeros(1) for r in res]}, key=key), flops
        weighted = role != "aggregator" or self.vote == "confidence"
        pick, lps, flops = self._select(m, problems, parents, weighted)
        chosen = [parents[pick[i]] for i in range(n)]
        texts = [chosen[i].texts[i] for i in range(n)]
        answers = [chosen[i].answers[i] for i in range(n)]
        lp = {m: [lps[pick[i]][i] for i in range(n)]} if weighted else {}
        if role == "aggregator":
            return Chains(texts, answers, lp, key=key), flops
        own = [least_confident_step(texts[i], lp[m][i]) for i in range(n)]
        if role == "critic":
            return Chains(texts, answers, lp, own, key=key), flops
        # refiner
        flags = [chosen[i].flags[i] if chosen[i].flags is not None else own[i]
                 for i in range(n)]
        prefixes = []
        for i in range(n):
            spans = step_spans(texts[i])
            f = min(flags[i], len(spans) - 1)
            prefixes.append(texts[i][:spans[f][0]] if spans[f][0] > 0 else "")
        seed = zlib.crc32(f"{key}|{self.seed}".encode()) % (2**31 - 1)
        res, gflops = self._generate(m, [p + q for p, q in zip(problems.prompts, prefixes,
                                                                strict=True)],
                                     self.refiner_temperature, seed)
        new_t, new_a, new_lp = list(texts), list(answers), list(lp[m])
        for i, r in enumerate(res):
            if r is None:
                continue
            t = prefixes[i] + r[0]
            cand = np.concatenate([lp[m][i][:len(prefixes[i])], r[1]])
            if self.accept == "always" or confidence(cand) >= confidence(lp[m][i]):
                new_t[i], new_a[i], new_lp[i] = t, parse_answer(t), cand
        return Chains(new_t, new_a, {m: new_lp}, key=key), flops + gflops

    def _key(self, graph: CollaborationGraph, idx: int, keys: dict, problems: Problems,
             seen: dict) -> str:
        node = graph.nodes[idx]
        base = (node.role, node.model, tuple(sorted(keys[p] for p in node.parents)),
                problems.key)
        sampled = node.role == "solver" or (node.role == "refiner"
                                            and self.refiner_temperature > 0)
        occ = seen.get(base, 0) if sampled else 0
        seen[base] = seen.get(base, 0) + 1
        return hashlib.sha1(repr(base + (occ,)).encode()).hexdigest()[:16]

    def run(self, graph: CollaborationGraph, problems: Problems) -> Result:
        """Executes the nodes the output depends on; returns a :class:`Result`."""
        graph.check_pool(len(self.pool))
        keys, outs, seen, lat, done = {}, {}, {}, {}, []
        gold = np.array(problems.answers)
        for idx in graph.ancestors():
            key = self._key(graph, idx, keys, problems, seen)
            keys[idx] = key
            self.stats["node_calls"] += 1
            if key in self.cache:
                self.stats["cache_hits"] += 1
            else:
                t = time.perf_counter()
                ch, flops = self._node(graph, idx, problems, outs, key)
                dt = time.perf_counter() - t
                self.stats["seconds"] += dt
                self.cache[key] = (ch, flops / len(problems), dt)
            ch, flops, dt = self.cache[key]
            outs[idx] = ch
            node = graph.nodes[idx]
            lat[idx] = dt + max((lat[p] for p in node.parents), default=0.0)
            acc = float(np.mean([a == g for a, g in zip(ch.answers, gold, strict=True)]))
            done.append(NodeOutcome(idx, node.role, node.model, node.parents, acc, flops, dt))
        out = outs[graph.output]
        acc = float(np.mean([a == g for a, g in zip(out.answers, gold, strict=True)]))
        return Result(acc, float(sum(o.flops for o in done)), float(lat[graph.output]),
                      tuple(done), tuple(out.answers))
