"""Random bijections and relational queries (geometric memorization's controlled setting).

``N`` entities serve both as subjects and as attributes; each of ``R``
relations is a uniformly random bijection ``pi_r: [N] -> [N]``. A one-hop query
is ``(s, r)`` with answer ``pi_r(s)``; an ``L``-hop chain ``c = (r_1, ..., r_L)``
asks ``pi_{r_L}(... pi_{r_1}(s))`` ("the mother of the wife of x").

Token layout of a query (used by :class:`~lab.methods.geomem.model.OneLayer`):
entity ids ``0..N-1``, then one relation token per (hop, relation):
``N + hop * R + r``. A query is ``[s, rel(0, r_1), ..., rel(L-1, r_L)]``; the
hop index is part of the token so that a bag of tokens still says the order.
"""

from __future__ import annotations

import itertools

import numpy as np


def check_sizes(n: int, r: int, hops: int = 1) -> None:
    """Raises ValueError unless ``n >= 2``, ``r >= 1`` and ``hops >= 1`` are ints."""
    for name, value, low in (("n_entities", n, 2), ("n_relations", r, 1), ("hops", hops, 1)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name}={value!r}; expected an int >= {low}")


def bijections(seed: int, n: int, r: int) -> np.ndarray:
    """Returns ``[R, N]`` int32: row ``r`` is a uniformly random permutation ``pi_r``.

    Drawn with NumPy from ``(seed, n, r)`` (a jax.random draw would compile per ``N``).
    """
    check_sizes(n, r)
    rng = np.random.default_rng([int(seed), int(n), int(r)])
    return np.stack([rng.permutation(n) for _ in range(r)]).astype(np.int32)


def chains(r: int, hops: int) -> np.ndarray:
    """Every chain of ``hops`` relations, ``[R**hops, hops]`` int32, lexicographic order."""
    check_sizes(2, r, hops)
    return np.asarray(list(itertools.product(range(r), repeat=hops)), np.int32).reshape(-1, hops)


def compose(perms, chain_list: np.ndarray) -> np.ndarray:
    """Composite maps ``[C, N]``: row ``c`` is ``pi_{c_L} o ... o pi_{c_1}``."""
    perms = np.asarray(perms)
    out = np.empty((len(chain_list), perms.shape[1]), np.int32)
    for c, chain in enumerate(np.asarray(chain_list)):
        m = np.arange(perms.shape[1])
        for rel in chain:
            m = perms[int(rel)][m]
        out[c] = m
    return out


def relation_token(n: int, r: int, hop, rel):
    """Token id of relation ``rel`` asked at hop ``hop``."""
    return n + hop * r + rel


def vocab_size(n: int, r: int, hops: int) -> int:
    return n + hops * r


def queries(perms, hops: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every ``hops``-hop query over all subjects and chains.

    Returns:
      ``tokens [C*N, 1+hops]`` int32 (chain-major: rows ``c*N .. c*N+N-1`` ask
      chain ``c`` of every subject), ``answers [C*N]`` and the chain list ``[C, hops]``.
    """
    perms = np.asarray(perms)
    r, n = perms.shape
    chain_list = chains(r, hops)
    answers = compose(perms, chain_list)  # [C, N]
    c = len(chain_list)
    subj = np.tile(np.arange(n), c)
    rel_tok = [np.repeat(relation_token(n, r, hop, chain_list[:, hop]), n) for hop in range(hops)]
    tokens = np.stack([subj, *rel_tok], axis=1).astype(np.int32)
    return tokens, answers.reshape(-1), chain_list


def cot_steps(perms, hops: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Teacher-forced chain-of-thought steps of every ``hops``-hop query.

    The sequence of query ``(s, c)`` is ``[s, rel(0, c_1), ..., rel(L-1, c_L), e_1, ...,
    e_L]`` with ``e_k = pi_{c_k}(... pi_{c_1}(s))`` the intermediate answers: the model
    emits ``e_1`` after reading the query, reads it back, emits ``e_2`` and so on, and
    ``e_L`` is the answer. Step ``k`` (``0 <= k < L``) is the prefix ending just before
    ``e_{k+1}``, left-padded with :data:`~lab.methods.geomem.model.PAD` (-1) to one
    length ``2L`` so that every step shares a batch.

    Returns:
      ``tokens [L, C*N, 2L]`` int32 (step-major; rows ordered as :func:`queries`),
      ``targets [L, C*N]`` (``e_{k+1}``; the last step's are the answers) and the
      chain list ``[C, L]``.
    """
    perms = np.asarray(perms)
    r, n = perms.shape
    base, _, chain_list = queries(perms, hops)  # [C*N, 1+L]
    inter = np.stack([compose(perms, chain_list[:, :k + 1]).reshape(-1) for k in range(hops)])
    width = 2 * hops
    tokens = np.full((hops, base.shape[0], width), -1, np.int32)
    for k in range(hops):
        prefix = np.concatenate([base, inter[:k].T], axis=1)  # [C*N, 1+L+k]
        tokens[k, :, width - prefix.shape[1]:] = prefix
    return tokens, inter.astype(np.int32), chain_list


def shortcut_baselines(perms, hops: int = 1) -> dict:
    """Accuracy of the obvious no-memory heuristics on every ``hops``-hop query.

    ``relation_only``: answer each chain with its most frequent answer (ignores the
    subject); ``copy_subject``: answer the subject itself; ``chance``: ``1 / N``. On
    bijections the first is exactly ``1 / N`` and the second counts fixed points of the
    composite maps (about one per map), so both stay near chance.
    """
    perms = np.asarray(perms)
    n = perms.shape[1]
    answers = compose(perms, chains(perms.shape[0], hops))  # [C, N]
    majority = np.mean([np.bincount(row, minlength=n).max() / n for row in answers])
    return {"relation_only": float(majority),
            "copy_subject": float(np.mean(answers == np.arange(n))), "chance": 1.0 / n}
