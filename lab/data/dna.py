"""A synthetic regulatory-sequence world for sequence design (GPA).

Sequences over ACGT are drawn from a first-order Markov background; motifs
(position weight matrices) are planted at random positions; a hidden activity
function of motif content and arrangement gives each sequence an activity in
two "cell types"; measurements add Gaussian noise. Everything is a pure
function of a seed, so ground truth is known exactly.

Activity (the hidden function; documented so experiments can audit it): with
``m_k`` the PWM match strength of motif ``k`` (sigmoid of the best log-odds
score, in [0, 1]) and ``pair`` = 1 when motifs 0 and 1 both match within
``spacing`` bases of each other,

    cell A = 2.0 m_0 + 1.5 m_1 + 1.0 pair - 1.5 m_2
    cell B = 2.0 m_2 + 1.0 m_3 - 1.0 m_0

so that high cell-A activity needs a specific arrangement and cell-A
specificity (A - B) needs motif 2 absent.
"""

from __future__ import annotations

import dataclasses
import functools

import datasets
import jax
import jax.numpy as jnp
import numpy as np

ALPHABET = "ACGT"
_INDEX = {c: i for i, c in enumerate(ALPHABET)}


def encode(sequences: str | list[str]) -> np.ndarray:
    """ACGT strings -> int32 ids ``[n, L]`` (one string -> ``[L]``).

    Raises ValueError naming the sequence, the position and the letter for
    anything outside ACGT, or for sequences of unequal length.
    """
    single = isinstance(sequences, str)
    seqs = [sequences] if single else list(sequences)
    if not seqs:
        return np.zeros((0, 0), np.int32)
    lengths = {len(s) for s in seqs}
    if len(lengths) > 1:
        raise ValueError(f"sequences have different lengths {sorted(lengths)}; expected one")
    out = np.empty((len(seqs), len(seqs[0])), np.int32)
    for i, s in enumerate(seqs):
        for j, ch in enumerate(s.upper()):
            if ch not in _INDEX:
                raise ValueError(f"sequence {i} has {ch!r} at position {j}; expected only "
                                 f"{', '.join(ALPHABET)}")
            out[i, j] = _INDEX[ch]
    return out[0] if single else out


def decode(ids) -> str | list[str]:
    arr = np.asarray(ids)
    if arr.ndim == 1:
        return "".join(ALPHABET[int(i)] for i in arr)
    return ["".join(ALPHABET[int(i)] for i in row) for row in arr]


@dataclasses.dataclass(frozen=True)
class DNAWorld:
    """The fixed parameters of the world (see the module docstring)."""

    seq_len: int
    initial: np.ndarray  # [4] background start distribution
    transition: np.ndarray  # [4, 4] background Markov chain
    pwms: np.ndarray  # [n_motifs, motif_len, 4] probabilities
    plant_prob: float
    spacing: int
    noise: float

    @property
    def n_motifs(self) -> int:
        return self.pwms.shape[0]

    @property
    def motif_len(self) -> int:
        return self.pwms.shape[1]

    @property
    def log_odds(self) -> np.ndarray:
        """PWM log-odds against the background's stationary composition ``[K, W, 4]``."""
        return np.log(self.pwms) - np.log(self.background_composition())[None, None, :]

    def background_composition(self) -> np.ndarray:
        vals, vecs = np.linalg.eig(self.transition.T)
        pi = np.real(vecs[:, np.argmin(np.abs(vals - 1))])
        return pi / pi.sum()


def make_world(seed: int = 0, *, seq_len: int = 64, n_motifs: int = 4, motif_len: int = 8,
               plant_prob: float = 0.3, spacing: int = 12, noise: float = 0.3) -> DNAWorld:
    """A random world: a GC-poor background chain and ``n_motifs`` sharp PWMs."""
    if seq_len < 2 * motif_len:
        raise ValueError(f"seq_len={seq_len} is too short for two motifs of length {motif_len}")
    if n_motifs < 4:
        raise ValueError(f"n_motifs={n_motifs}; the activity function needs at least 4")
    rng = np.random.default_rng(seed)
    transition = rng.dirichlet(np.array([3.0, 1.5, 1.5, 3.0]), size=4)
    initial = np.full(4, 0.25)
    consensus = rng.integers(0, 4, size=(n_motifs, motif_len))
    pwms = np.full((n_motifs, motif_len, 4), 0.04)
    pwms[np.arange(n_motifs)[:, None], np.arange(motif_len)[None], consensus] = 0.88
    return DNAWorld(seq_len, initial, transition, pwms, plant_prob, spacing, noise)


def sample_background(world: DNAWorld, key: jax.Array, n: int) -> jax.Array:
    """``[n, L]`` ids from the Markov background."""
    return _background(jnp.asarray(world.initial), jnp.asarray(world.transition), key,
                       n=n, seq_len=world.seq_len)


@functools.partial(jax.jit, static_argnames=("n", "seq_len"))
def _background(initial, transition, key, *, n: int, seq_len: int):
    k0, k1 = jax.random.split(key)
    logt = jnp.log(transition)
    first = jax.random.categorical(k0, jnp.log(initial), shape=(n,))

    def step(prev, k):
        nxt = jax.random.categorical(k, logt[prev])
        return nxt, nxt

    _, rest = jax.lax.scan(step, first, jax.random.split(k1, seq_len - 1))
    return jnp.concatenate([first[:, None], rest.T], axis=1).astype(jnp.int32)


def plant_motifs(world: DNAWorld, key: jax.Array, seqs: jax.Array) -> jax.Array:
    """Plants each motif (a PWM sample) with probability ``plant_prob`` at a random position."""
    return _plant(jnp.log(jnp.asarray(world.pwms)), key, seqs, plant_prob=world.plant_prob)


@functools.partial(jax.jit, static_argnames=("plant_prob",))
def _plant(log_pwms, key, seqs, *, plant_prob: float):
    n, length = seqs.shape
    w = log_pwms.shape[1]
    for k in range(log_pwms.shape[0]):
        key, kp, ks, kw = jax.random.split(key, 4)
        present = jax.random.bernoulli(kp, plant_prob, (n,))
        start = jax.random.randint(ks, (n,), 0, length - w + 1)
        site = jax.random.categorical(kw, log_pwms[k], shape=(n, w))
        cols = start[:, None] + jnp.arange(w)[None]
        rows = jnp.broadcast_to(jnp.arange(n)[:, None], cols.shape)
        planted = seqs.at[rows, cols].set(site)
        seqs = jnp.where(present[:, None], planted, seqs)
    return seqs


def motif_scan(world: DNAWorld, seqs: jax.Array) -> jax.Array:
    """PWM log-odds score of every motif at every offset ``[n, K, L - W + 1]``."""
    return _scan(jnp.asarray(world.log_odds, jnp.float32), seqs)


@jax.jit
def _scan(lo, seqs):
    onehot = jax.nn.one_hot(seqs, 4, dtype=jnp.float32)  # [n, L, 4]
    w = lo.shape[1]
    windows = jnp.stack([onehot[:, i:i + seqs.shape[1] - w + 1] for i in range(w)], axis=2)
    return jnp.einsum("nowa,kwa->nko", windows, lo)


def motif_strength(world: DNAWorld, seqs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Match strength ``m [n, K]`` in [0, 1] and the best offsets ``[n, K]``."""
    return _strength(jnp.asarray(world.log_odds, jnp.float32), seqs)


@jax.jit
def _strength(lo, seqs):
    scan = _scan(lo, seqs)
    best = jnp.max(scan, axis=-1)
    threshold = 0.6 * float(np.log(0.88 / 0.25)) * lo.shape[1]  # ~60% of a perfect site
    return jax.nn.sigmoid(2.0 * (best - threshold)), jnp.argmax(scan, axis=-1)


def activity(world: DNAWorld, seqs: jax.Array) -> jax.Array:
    """The hidden activity ``[n, 2]`` (cell A, cell B) of the module docstring."""
    return _activity(jnp.asarray(world.log_odds, jnp.float32), seqs, spacing=world.spacing)


@functools.partial(jax.jit, static_argnames=("spacing",))
def _activity(lo, seqs, *, spacing: int):
    m, where = _strength(lo, seqs)
    close = jnp.abs(where[:, 0] - where[:, 1]) <= spacing
    pair = m[:, 0] * m[:, 1] * close
    a = 2.0 * m[:, 0] + 1.5 * m[:, 1] + 1.0 * pair - 1.5 * m[:, 2]
    b = 2.0 * m[:, 2] + 1.0 * m[:, 3] - 1.0 * m[:, 0]
    return jnp.stack([a, b], axis=-1)


def sample(world: DNAWorld, key: jax.Array, n: int) -> jax.Array:
    """Training-distribution sequences: background plus planted motifs ``[n, L]``."""
    kb, kp = jax.random.split(key)
    return plant_motifs(world, kp, sample_background(world, kb, n))


def dataset(world: DNAWorld, n: int, seed: int) -> datasets.Dataset:
    """``n`` sequences with true and measured activities (columns: sequence, tokens,
    activity_a, activity_b, measured_a, measured_b)."""
    k1, k2 = jax.random.split(jax.random.key(seed))
    seqs = sample(world, k1, n)
    act = np.asarray(activity(world, seqs))
    meas = act + world.noise * np.asarray(jax.random.normal(k2, act.shape))
    ids = np.asarray(seqs)
    return datasets.Dataset.from_dict({
        "sequence": decode(ids), "tokens": ids.tolist(),
        "activity_a": act[:, 0], "activity_b": act[:, 1],
        "measured_a": meas[:, 0], "measured_b": meas[:, 1],
    })


# --- sequence statistics used as design metrics ---------------------------------------------


def kmer_codes(seqs, k: int) -> np.ndarray:
    """The base-4 code of every k-mer of every sequence ``[n, L - k + 1]``."""
    s = np.asarray(seqs)
    if s.ndim == 1:
        s = s[None]
    codes = np.zeros((s.shape[0], s.shape[1] - k + 1), np.int64)
    for i in range(k):
        codes = codes * 4 + s[:, i:s.shape[1] - k + 1 + i]
    return codes


def kmer_spectrum(seqs, k: int = 3, exclude=None) -> np.ndarray:
    """Normalised k-mer counts ``[4**k]`` over all sequences; ``exclude``: k-mer codes
    left out (their entries are 0 and the rest renormalised)."""
    counts = np.bincount(kmer_codes(seqs, k).ravel(), minlength=4 ** k).astype(np.float64)
    if exclude is not None:
        counts[np.asarray(exclude, np.int64)] = 0.0
    return counts / max(counts.sum(), 1.0)


def motif_kmers(world: DNAWorld, k: int) -> np.ndarray:
    """The codes of every k-mer of every motif's consensus (the k-mers the hidden activity,
    and so the oracles, respond to); the others are statistics of the background alone."""
    consensus = np.argmax(world.pwms, -1)
    return np.unique(kmer_codes(consensus, k))


def js_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon divergence in bits (0 = same spectrum, 1 = disjoint)."""
    m = 0.5 * (p + q)

    def kl(a, b):
        nz = a > 0
        return float(np.sum(a[nz] * np.log2(a[nz] / b[nz])))

    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def max_homopolymer(seqs) -> np.ndarray:
    """Longest run of one letter in each sequence ``[n]``."""
    s = np.asarray(seqs)
    best = np.ones(s.shape[0], np.int64)
    run = np.ones(s.shape[0], np.int64)
    for j in range(1, s.shape[1]):
        run = np.where(s[:, j] == s[:, j - 1], run + 1, 1)
        best = np.maximum(best, run)
    return best


def mean_pairwise_hamming(seqs, max_pairs: int = 20000, seed: int = 0) -> float:
    """Mean normalised Hamming distance over (a sample of) pairs."""
    s = np.asarray(seqs)
    n = s.shape[0]
    if n < 2:
        return 0.0
    rng = np.random.default_rng(seed)
    i = rng.integers(0, n, max_pairs)
    j = rng.integers(0, n, max_pairs)
    keep = i != j
    return float(np.mean(s[i[keep]] != s[j[keep]]))
