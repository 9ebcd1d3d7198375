"""The synthetic regulatory world: encoding errors, planted motifs, the activity function."""

import jax
import numpy as np
import pytest

from lab.data import dna

WORLD = dna.make_world(0)


def test_encode_round_trip_and_rejects_bad_letters_with_position():
    assert dna.decode(dna.encode("ACGTTGCA")) == "ACGTTGCA"
    with pytest.raises(ValueError, match="sequence 1 has 'N' at position 2"):
        dna.encode(["ACGT", "ACNT"])
    with pytest.raises(ValueError, match="different lengths"):
        dna.encode(["ACG", "ACGT"])


def test_planted_motifs_are_found_by_the_scan():
    bg = dna.sample_background(WORLD, jax.random.key(0), 500)
    planted = dna.sample(WORLD, jax.random.key(0), 500)
    m_bg, _ = dna.motif_strength(WORLD, bg)
    m_pl, _ = dna.motif_strength(WORLD, planted)
    # plant_prob = 0.3: planted sequences match each motif up to 30% of the time (a later motif
    # may overwrite an earlier one), the background rarely.
    assert np.all(np.asarray(m_bg).mean(0) < 0.06)
    assert np.all((np.asarray(m_pl).mean(0) > 0.15) & (np.asarray(m_pl).mean(0) < 0.36))


def test_activity_rewards_the_arrangement():
    # A consensus site for motifs 0 and 1 placed close together beats the same sites far apart.
    cons = WORLD.pwms.argmax(-1)
    base = np.asarray(dna.sample_background(WORLD, jax.random.key(1), 1))[0]
    close, far = base.copy(), base.copy()
    close[0:8], close[10:18] = cons[0], cons[1]
    far[0:8], far[56:64] = cons[0], cons[1]
    a = np.asarray(dna.activity(WORLD, np.stack([close, far])))
    assert a[0, 0] - a[1, 0] == pytest.approx(1.0, abs=0.1)


def test_sequence_statistics():
    s = dna.encode(["AAAACG", "ACGTAC"])
    np.testing.assert_array_equal(dna.max_homopolymer(s), [4, 1])
    p = dna.kmer_spectrum(s, 2)
    assert p.sum() == pytest.approx(1.0) and dna.js_divergence(p, p) == pytest.approx(0.0)
    assert dna.mean_pairwise_hamming(s) == pytest.approx(5 / 6)
