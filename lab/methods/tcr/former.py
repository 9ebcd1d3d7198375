"""TCR-Former: a Transformer whose attention follows the story's causal topology.

The end-to-end half of "TCR-Agent and TCR-Former" (the NeurIPS 2026 TempoCausal paper):
the mechanisms the agent runs symbolically are put into the attention of a plain
:class:`lab.nn.Transformer`, through its existing ``mask=`` / ``bias=`` arguments:

- **layout reordering** (the paper's "from discrete narratives to causal topologies",
  after document-layout reordering): the narrative's statements are re-laid in a
  causal-topological order (each event's span statement, then the links into it,
  events in topological order), so a causal decoder reads causes before effects;
- **causal-topological attention mask**: a token of a statement about event ``e`` (a
  span of ``e``, or a link into ``e``) may attend to the tokens of statements about
  ``e`` and its ancestors only; the question and answer tokens attend to every earlier
  token;
- **temporal-span bias**: a learned per-head bias indexed by the bucketed difference of
  the start times of the query's and the key's events, ``clip(s_q - s_k, -K, K)``, plus
  one bucket for tokens with no event span (:class:`SpanBias`, added to the logits of
  every layer).

The structure comes from a lenient reading of the statements (:func:`structure`): a
statement naming two events is a link from the first to the second, one naming one
event and two numbers is its span, whatever the other words. Without it (no event
names) the mask falls back to plain causal attention and the bias to its no-span bucket.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab.data.synthetic.tempocausal import EVENT_NAMES, QUESTIONS
from lab.nn import Transformer, TransformerConfig

SPECIAL = ("<pad>", "<eos>", "<nl>")
_WORDS = ("lasted from to . caused Q: options: A: yes no ; ran until led "
          + " ".join(QUESTIONS.values()))
MAX_TIME = 64


class WordVocab:
    """The closed word vocabulary of TempoCausal text (specials, words, event names,
    numbers ``0..MAX_TIME-1``); ``"\\n"`` is the token ``<nl>``."""

    def __init__(self):
        words = list(SPECIAL)
        for w in _WORDS.split() + list(EVENT_NAMES) + [str(i) for i in range(MAX_TIME)]:
            if w not in words:
                words.append(w)
        self.words = words
        self.ids = {w: i for i, w in enumerate(words)}
        self.events = frozenset(EVENT_NAMES)

    def __len__(self):
        return len(self.words)

    def encode(self, text: str) -> list[int]:
        out = []
        for w in text.replace("\n", " <nl> ").split():
            if w not in self.ids:
                raise ValueError(f"word {w!r} is outside the TempoCausal vocabulary")
            out.append(self.ids[w])
        return out

    def decode(self, ids) -> str:
        return " ".join(self.words[int(i)] for i in ids)


@dataclasses.dataclass
class Structure:
    """Per statement: its owner event, its events, and the owner's start time."""

    statements: list[list[str]]
    owners: list[str | None]
    starts: dict[str, int]
    ancestors: dict[str, set[str]]
    order: list[int]          # statement indices in causal-topological order


def structure(statements: list[str], events=frozenset(EVENT_NAMES)) -> Structure:
    """The lenient reading of a narrative's statements (see the module docstring)."""
    words = [s.split() for s in statements]
    owners: list[str | None] = []
    links: list[bool] = []
    starts: dict[str, int] = {}
    parents: dict[str, set[str]] = {}
    for ws in words:
        names = [w for w in ws if w in events]
        nums = [int(w) for w in ws if w.isdigit()]
        for e in names:
            parents.setdefault(e, set())
        links.append(len(names) >= 2)
        if len(names) >= 2:
            parents[names[-1]].add(names[0])
            owners.append(names[-1])
        elif len(names) == 1:
            owners.append(names[0])
            if nums:
                starts[names[0]] = nums[0]
        else:
            owners.append(None)
    ancestors: dict[str, set[str]] = {}

    def anc(e, seen=()):
        if e not in ancestors:
            out = set()
            for p in parents[e]:
                if p not in seen:
                    out |= {p} | anc(p, (*seen, e))
            ancestors[e] = out
        return ancestors[e]

    for e in parents:
        anc(e)
    rank = {e: (len(ancestors[e]), starts.get(e, 0), e) for e in parents}
    order = sorted(range(len(words)), key=lambda k: (
        rank[owners[k]] if owners[k] else (10 ** 6, 0, ""), links[k], k))
    return Structure(words, owners, starts, ancestors, order)


@dataclasses.dataclass
class Encoded:
    """Token arrays of a set of rows (``N`` rows padded to ``T``)."""

    tokens: np.ndarray        # [N, T] int32
    weights: np.ndarray       # [N, T] float32, 1 where the target (next token) is trained
    answer_pos: np.ndarray    # [N] index whose logits predict the answer
    options: np.ndarray       # [N, 4] option token ids (-1 = none)
    answer: np.ndarray        # [N] answer token id
    prompt_len: np.ndarray    # [N] tokens before the completion
    mask: np.ndarray | None   # [N, T, T] bool: the causal-topological mask
    buckets: np.ndarray | None  # [N, T, T] int8: temporal-span bias buckets


def encode(rows, vocab: WordVocab, *, length: int, layout: str = "narrative",
           cot: bool = False, former: bool = False, span_clip: int = 8) -> Encoded:
    """Encodes TempoCausal rows: narrative (``layout="narrative"`` as told, or
    ``"topological"``), ``<nl>``, question line, ``<nl>``, completion (trace when ``cot``,
    then ``A: <answer>``), ``<eos>``; with ``former`` also the mask and bias buckets."""
    if layout not in ("narrative", "topological"):
        raise ValueError(f"layout={layout!r}; expected 'narrative' or 'topological'")
    n = len(rows)
    toks = np.zeros((n, length), np.int32)
    weights = np.zeros((n, length), np.float32)
    answer_pos = np.zeros(n, np.int32)
    options = np.full((n, 4), -1, np.int32)
    answer = np.zeros(n, np.int32)
    prompt_len = np.zeros(n, np.int32)
    mask = np.zeros((n, length, length), bool) if former else None
    buckets = np.zeros((n, length, length), np.int8) if former else None
    for r_i, row in enumerate(rows):
        st = structure(row["statements"], vocab.events)
        order = st.order if layout == "topological" else range(len(st.statements))
        seq, seg = [], []
        for k in order:
            ids = vocab.encode(" ".join(st.statements[k]))
            seq += ids
            seg += [k] * len(ids)
        q_line = row["prompt"].strip().split("\n")[-1]
        tail = vocab.encode(" <nl> " + q_line + " <nl> ")
        comp = (f"{row['trace']} ;\n" if cot else "") + f"A: {row['answer']}"
        c_ids = vocab.encode(comp) + [vocab.ids["<eos>"]]
        p_len = len(seq) + len(tail)
        full = seq + tail + c_ids
        if len(full) > length:
            raise ValueError(f"row {r_i} has {len(full)} tokens; expected at most "
                             f"length={length}")
        toks[r_i, :len(full)] = full
        weights[r_i, p_len - 1:len(full) - 1] = 1.0
        a_at = len(full) - 2                     # the answer token
        answer_pos[r_i] = a_at - 1
        answer[r_i] = full[a_at]
        opts = [vocab.ids[o] for o in row["options"]]
        options[r_i, :len(opts)] = opts
        prompt_len[r_i] = p_len
        if former:
            seg = np.array(seg + [-1] * (length - len(seg)))
            owner = [st.owners[k] for k in seg[:len(seq)]]
            rest = [w for w in (vocab.words[t] for t in full[len(seq):])]
            owner += [w if w in vocab.events else None for w in rest]
            owner += [None] * (length - len(owner))
            mask[r_i] = _mask(seg, owner, st, len(seq), length)
            buckets[r_i] = _buckets(owner, st.starts, span_clip)
    return Encoded(toks, weights, answer_pos, options, answer, prompt_len, mask, buckets)


def _mask(seg, owner, st: Structure, n_story: int, length: int) -> np.ndarray:
    """Causal-topological mask ``[T, T]``: story tokens see their own statement and the
    statements about their event or its ancestors; question/answer tokens see everything;
    all within causal (index) order."""
    names = sorted(st.ancestors)
    eid = {e: i for i, e in enumerate(names)}
    reach = np.eye(len(names) + 1, dtype=bool)            # last row/col: no event
    reach[-1, -1] = False
    for e, anc in st.ancestors.items():
        reach[eid[e], [eid[a] for a in anc]] = True
    own = np.array([eid.get(o, len(names)) if o else len(names) for o in owner])
    rel = reach[own[:, None], own[None, :]] | (seg[:, None] == seg[None, :])
    rel[n_story:, :] = True
    idx = np.arange(length)
    return (idx[None, :] <= idx[:, None]) & rel


def _buckets(owner, starts, clip: int) -> np.ndarray:
    """``[T, T]`` bucket ids: ``clip(s_q - s_k, -clip, clip) + clip``, or ``2 clip + 1``
    when either token has no event with a span."""
    s = np.array([starts.get(o, -10 ** 6) if o else -10 ** 6 for o in owner])
    ok = s > -10 ** 6
    diff = np.clip(s[:, None] - s[None, :], -clip, clip) + clip
    return np.where(ok[:, None] & ok[None, :], diff, 2 * clip + 1).astype(np.int8)


class SpanBias(nnx.Module):
    """Learned temporal-span bias: ``table [H, 2K + 2]`` gathered by bucket ids into the
    additive attention bias ``[B, H, T, T]`` (zero at initialisation)."""

    def __init__(self, n_heads: int, clip: int = 8):
        self.table = nnx.Param(jnp.zeros((n_heads, 2 * clip + 2), jnp.float32))
        self.clip = clip

    def __call__(self, buckets: jax.Array) -> jax.Array:
        return jnp.moveaxis(self.table[...][:, buckets.astype(jnp.int32)], 0, 1)


class TCRFormer(nnx.Module):
    """:class:`lab.nn.Transformer` + :class:`SpanBias`; ``former=False`` is the same-size
    plain Transformer (the mask and bias are ignored)."""

    def __init__(self, config: TransformerConfig, *, former: bool, span_clip: int = 8,
                 rngs: nnx.Rngs):
        self.lm = Transformer(config, rngs=rngs)
        self.span = SpanBias(config.n_heads, span_clip) if former else None
        self.former = former

    def __call__(self, tokens, mask=None, buckets=None):
        if not self.former:
            return self.lm(tokens)
        return self.lm(tokens, mask=mask[:, None], bias=self.span(buckets))
