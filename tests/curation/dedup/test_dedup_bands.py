"""``bands.bit_statistics`` (the band planner's measure of the bits) counts exactly what NumPy's
correlation gives, a constant bit (a PHash's DC bit) counting as uncorrelated with entropy 0; ``near.unique_inverse``
equals ``np.unique(..., return_inverse=True)``."""

import numpy as np

from curation.dedup.bands import bit_statistics


def test_bit_statistics_equal_numpys_correlation_and_entropy():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 4))
    bits = ((rng.standard_normal((3001, 4)) @ w.T + rng.standard_normal((3001, 64))) > 0).astype(np.uint8)
    bits[:, 63] = 1  # always set, as PHash's DC bit
    bits[:, 7] = 0
    entropy, corr = bit_statistics(bits)
    with np.errstate(invalid="ignore", divide="ignore"):
        expected = np.nan_to_num(np.abs(np.corrcoef(bits.T.astype(np.float64))), nan=0.0)
    assert np.abs(corr - expected).max() < 1e-9
    assert corr[63].max() == corr[:, 7].max() == 0.0
    p = bits.mean(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        h = np.nan_to_num(-(p * np.log2(p) + (1 - p) * np.log2(1 - p)), nan=0.0)
    assert (
        np.abs(entropy - h).max() < 1e-6 and entropy[[7, 63]].max() < 1e-9 and np.delete(entropy, [7, 63]).min() > 0.5
    )


def test_unique_inverse_equals_numpys():
    from curation.dedup.near import unique_inverse

    values = np.random.default_rng(1).integers(0, 500, 5000).astype(np.uint64)
    for v in (values, values[:1], values[:0]):
        expected = np.unique(v, return_inverse=True)
        got = unique_inverse(v)
        assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
