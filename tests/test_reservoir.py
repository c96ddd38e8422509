"""Reservoir sampling: Algorithm R's inclusion probabilities and the exponential
memory of the recency-weighted reservoir."""
import math

import numpy as np
import pytest

from streamfhmm.stream.reservoir import Reservoir


def _run(capacity, n, half_life=None, stride=1, seed=0):
    r = Reservoir(capacity, 1, 1, half_life=half_life, stride=stride, random_state=seed)
    for t in range(n):
        r.offer(np.full((1, 1), float(t)), t)
    return r


def test_algorithm_r_inclusion_is_uniform():
    seed, trials, C, n = 1, 4000, 5, 40
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    counts = np.zeros(n)
    for _ in range(trials):
        r = _run(C, n, seed=rng)
        assert r.size == C and r.n_seen == n
        counts[r.end[:r.size]] += 1
    p = counts / trials
    # every item is kept with probability C / n = 0.125; binomial sd ≈ 0.0052
    np.testing.assert_allclose(p, C / n, atol=0.025)
    # the first and last items are not favoured
    assert abs(p[:10].mean() - p[-10:].mean()) < 0.015


def test_reservoir_fills_in_order():
    r = _run(4, 3)
    assert r.size == 3
    np.testing.assert_array_equal(r.end[:3], [0, 1, 2])
    np.testing.assert_array_equal(r.data[:3, 0, 0], [0, 1, 2])


@pytest.mark.parametrize("half_life,stride", [(200.0, 1), (600.0, 5)])
def test_recency_survival_halves_every_half_life(half_life, stride):
    seed, C = 2, 50
    print(f"seed={seed}")
    r = Reservoir(C, 1, 1, half_life=half_life, stride=stride, random_state=seed)
    survivors = []
    n_offers = 4000
    for i in range(n_offers):
        r.offer(np.zeros((1, 1)), i * stride)
        if i >= 1000 and i % 5 == 0:
            survivors.append((i * stride - r.end[:r.size]).copy())
    ages = np.concatenate(survivors)
    # a full reservoir keeps each stored segment with probability 2^(-stride/half_life)
    # per offer: the ages (in samples) of the stored segments are geometric with that
    # survival, so their median is about one half-life
    q = 2.0 ** (-stride / half_life)
    mean_age = stride * q / (1 - q)
    assert abs(ages.mean() - mean_age) / mean_age < 0.1
    assert abs(np.median(ages) - half_life) / half_life < 0.15


def test_recency_cap_and_uniform_insert_probability():
    r = Reservoir(100, 1, 1, half_life=10.0, stride=1)
    assert r.insert_probability == 1.0  # C · (1 - 2^(-1/10)) > 1
    r = Reservoir(10, 1, 1, half_life=1000.0, stride=2)
    assert math.isclose(r.insert_probability, 10 * (1 - 2 ** (-2 / 1000)))
    u = _run(10, 40)
    assert math.isclose(u.insert_probability, 10 / 40)


def test_uniform_reservoir_keeps_old_data_recency_does_not():
    seed = 3
    print(f"seed={seed}")
    u = _run(100, 20_000, seed=seed)
    w = _run(100, 20_000, half_life=500.0, seed=seed)
    assert np.median(u.end[:u.size]) < 15_000        # spread over the whole stream
    assert np.median(w.end[:w.size]) > 20_000 - 1000  # the recent past


def test_round_trip_continues_identically():
    r = _run(5, 30, half_life=20.0, seed=4)
    arrays = r.to_arrays()
    back = Reservoir.from_arrays(arrays)
    for t in range(30, 60):
        seg = np.full((1, 1), float(t))
        assert r.offer(seg, t) == back.offer(seg, t)
    np.testing.assert_array_equal(r.data, back.data)
    np.testing.assert_array_equal(r.sample_slots(3, 2), back.sample_slots(3, 2))


def test_errors():
    with pytest.raises(ValueError, match="half_life"):
        Reservoir(3, 2, 1, half_life=0.0)
    with pytest.raises(ValueError, match="empty"):
        Reservoir(3, 2, 1).sample_slots(1, 1)
    arrays = _run(3, 5).to_arrays()
    arrays["data"] = arrays["data"][:2]
    with pytest.raises(ValueError, match="do not match"):
        Reservoir.from_arrays(arrays)


def _run_many(capacity, n, half_life=None, stride=1, seed=0, batch=37):
    r = Reservoir(capacity, 1, 1, half_life=half_life, stride=stride, random_state=seed)
    for t0 in range(0, n, batch):
        ts = list(range(t0, min(n, t0 + batch)))
        r.offer_many([np.full((1, 1), float(t)) for t in ts], ts)
    return r


def test_offer_many_keeps_algorithm_r_uniform():
    seed, trials, C, n = 3, 4000, 5, 40
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    counts = np.zeros(n)
    for _ in range(trials):
        r = _run_many(C, n, seed=rng, batch=int(rng.integers(1, 15)))
        assert r.size == C and r.n_seen == n
        np.testing.assert_array_equal(r.data[:C, 0, 0], r.end[:C])   # segment and end together
        counts[r.end[:r.size]] += 1
    p = counts / trials
    np.testing.assert_allclose(p, C / n, atol=0.025)
    assert abs(p[:10].mean() - p[-10:].mean()) < 0.015


def test_offer_many_fills_in_order_then_samples():
    r = _run_many(4, 3)
    np.testing.assert_array_equal(r.end[:3], [0, 1, 2])
    r = Reservoir(4, 1, 1, random_state=0)
    assert r.offer_many([np.full((1, 1), float(t)) for t in range(6)], list(range(6))) >= 4
    assert r.size == 4 and r.n_seen == 6


def test_offer_many_recency_survival_halves_every_half_life():
    seed, C, half_life, stride = 4, 50, 200.0, 1
    print(f"seed={seed}")
    r = Reservoir(C, 1, 1, half_life=half_life, stride=stride, random_state=seed)
    survivors = []
    for b in range(800):
        ts = [5 * b + i for i in range(5)]
        r.offer_many([np.zeros((1, 1))] * 5, ts)
        if b >= 200:
            survivors.append((ts[-1] - r.end[:r.size]).copy())
    ages = np.concatenate(survivors)
    q = 2.0 ** (-stride / half_life)
    mean_age = stride * q / (1 - q)
    # sampled just after a batch: the ages are those of offer() plus up to 4 samples
    assert abs(ages.mean() - mean_age) / mean_age < 0.1
    assert abs(np.median(ages) - half_life) / half_life < 0.15
