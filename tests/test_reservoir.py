"""Reservoir sampling: Algorithm R's inclusion probabilities and the exponential
memory of the recency-weighted reservoir."""
import json
import math

import numpy as np
import pytest

from streamfhmm.stream.reservoir import Reservoir


def _run(capacity, n, half_life=None, stride=1, seed=0, batch=None):
    """Offer segments 0 … n-1 (segment t holds t): one by one, or ``batch`` at a time
    through ``offer_many``."""
    r = Reservoir(capacity, 1, 1, half_life=half_life, stride=stride, random_state=seed)
    if batch is None:
        for t in range(n):
            r.offer(np.full((1, 1), float(t)), t)
        return r
    for t0 in range(0, n, batch):
        ts = list(range(t0, min(n, t0 + batch)))
        r.offer_many([np.full((1, 1), float(t)) for t in ts], ts)
    return r


@pytest.mark.parametrize("seed,batched", [(1, False), (3, True)])
def test_algorithm_r_inclusion_is_uniform(seed, batched):
    trials, C, n = 4000, 5, 40
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    counts = np.zeros(n)
    for _ in range(trials):
        r = _run(C, n, seed=rng, batch=int(rng.integers(1, 15)) if batched else None)
        assert r.size == C and r.n_seen == n
        np.testing.assert_array_equal(r.data[:C, 0, 0], r.end[:C])   # segment and end together
        counts[r.end[:r.size]] += 1
    p = counts / trials
    # every item is kept with probability C / n = 0.125; binomial sd ≈ 0.0052
    np.testing.assert_allclose(p, C / n, atol=0.025)
    # the first and last items are not favoured
    assert abs(p[:10].mean() - p[-10:].mean()) < 0.015


@pytest.mark.parametrize("batch", [None, 37])
def test_reservoir_fills_in_order(batch):
    r = _run(4, 3, batch=batch)
    assert r.size == 3
    np.testing.assert_array_equal(r.end[:3], [0, 1, 2])
    np.testing.assert_array_equal(r.data[:3, 0, 0], [0, 1, 2])


def test_offer_many_counts_what_it_stored():
    r = Reservoir(4, 1, 1, random_state=0)
    assert r.offer_many([np.full((1, 1), float(t)) for t in range(6)], list(range(6))) >= 4
    assert r.size == 4 and r.n_seen == 6


@pytest.mark.parametrize("seed,half_life,stride,batch", [(2, 200.0, 1, 1), (2, 600.0, 5, 1), (4, 200.0, 1, 5)])
def test_recency_survival_halves_every_half_life(seed, half_life, stride, batch):
    C = 50
    print(f"seed={seed}")
    r = Reservoir(C, 1, 1, half_life=half_life, stride=stride, random_state=seed)
    survivors = []
    n_offers = 4000
    for i0 in range(0, n_offers, batch):
        ts = [i * stride for i in range(i0, i0 + batch)]
        if batch == 1:
            r.offer(np.zeros((1, 1)), ts[0])
        else:
            r.offer_many([np.zeros((1, 1))] * batch, ts)
        i = i0 + batch - 1
        if i >= 1000 and (i + 1) % 5 == 0:
            survivors.append((ts[-1] - r.end[:r.size]).copy())
    ages = np.concatenate(survivors)
    # a full reservoir keeps each stored segment with probability 2^(-stride/half_life)
    # per offer: the ages (in samples) of the stored segments are geometric with that
    # survival, so their median is about one half-life (sampled after a batch of 5: plus
    # up to 4 samples)
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
    assert math.isclose(u.insert_probability, 10 / 41)   # the 41st offer's chance


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


@pytest.mark.parametrize("half_life", ["abc", "5", [5], True, np.bool_(True), math.nan, -1.0])
def test_half_life_must_be_a_positive_number(half_life):
    """Strings, lists and bools were taken through float() (True as 1 sample) or gave
    raw conversion errors."""
    with pytest.raises(ValueError, match="half_life must be a positive number of samples or None"):
        Reservoir(3, 2, 1, half_life=half_life)
    assert Reservoir(3, 2, 1, half_life=np.int64(5)).half_life == 5.0


@pytest.mark.parametrize("half_life", [None, 4.0])
def test_refused_offer_changes_nothing(half_life):
    """A segment of another shape is refused before anything is counted: it raised numpy's
    broadcast error after size and n_seen had gone up (an unwritten slot counted as
    filled). offer_many checks every segment, and one end per segment, first."""
    seed = 5
    print(f"seed={seed}")
    r = Reservoir(3, 2, 1, half_life=half_life, random_state=seed)
    r.offer(np.ones((2, 1)), 0)
    before = r.to_arrays()
    for bad in (np.zeros((5, 1)), np.zeros((2, 2)), np.zeros(2)):
        with pytest.raises(ValueError, match=r"shape \(segment_length, n_features\) = \(2, 1\)"):
            r.offer(bad, 1)
    with pytest.raises(ValueError, match="one end position per segment, got 5 segments and 2 ends"):
        r.offer_many([np.zeros((2, 1))] * 5, [1, 2])
    with pytest.raises(ValueError, match=r"got \(3, 1\)"):
        r.offer_many([np.zeros((2, 1)), np.zeros((3, 1))], [1, 2])
    after = r.to_arrays()
    assert str(after["meta"]) == str(before["meta"])
    np.testing.assert_array_equal(after["data"], before["data"])
    assert r.size == 1 and r.n_seen == 1
    assert r.offer(np.full((2, 1), 7.0), 1) == 1 and r.size == 2


@pytest.mark.parametrize("size, n_seen", [(3, -5), (3, 2), (3, 0), (4, 9), (-1, 5)])
def test_a_state_with_impossible_counters_is_refused(size, n_seen):
    """size within [0, capacity] and at most the segments seen: a negative count stopped
    the learner thread at its next drain, one below size biased Algorithm R."""
    import json
    arrays = _run(3, 5).to_arrays()
    meta = json.loads(str(arrays["meta"]))
    meta.update(size=size, n_seen=n_seen)
    arrays["meta"] = np.array(json.dumps(meta))
    arrays["data"] = np.zeros((max(size, 0), 1, 1))
    arrays["end"] = np.zeros(max(size, 0), dtype=np.int64)
    with pytest.raises(ValueError, match="size .* and segments seen .* must satisfy"):
        Reservoir.from_arrays(arrays)


@pytest.mark.parametrize("bit_generator", ["PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64"])
def test_round_trip_with_every_bit_generator(bit_generator):
    """The state of any numpy bit generator goes through the JSON description (MT19937,
    Philox and SFC64 states hold arrays: to_arrays raised TypeError)."""
    import json
    seed = 6
    print(f"seed={seed}")
    rng = np.random.Generator(getattr(np.random, bit_generator)(seed))
    r = Reservoir(4, 1, 1, half_life=10.0, random_state=rng)
    for t in range(20):
        r.offer(np.full((1, 1), float(t)), t)
    rng.integers(0, 7, size=3, dtype=np.uint32)   # (a buffered half word in the state)
    arrays = r.to_arrays()
    json.loads(str(arrays["meta"]))
    back = Reservoir.from_arrays(arrays)
    assert type(back.rng.bit_generator).__name__ == bit_generator
    for t in range(20, 60):
        seg = np.full((1, 1), float(t))
        assert r.offer(seg, t) == back.offer(seg, t)
    np.testing.assert_array_equal(r.sample_slots(3, 2), back.sample_slots(3, 2))


# -- gaps a mutation run found (each test fails on its mutant) --------------------------------
def test_offer_many_counts_the_segments_stored_in_a_full_reservoir():
    """offer_many returns every segment stored, replacements of a full reservoir too."""
    print("seed=0")
    r = Reservoir(2, 1, 1, half_life=1e-9, random_state=0)   # insert probability 1: all stored
    assert r.insert_probability == 1.0
    assert r.offer_many([np.full((1, 1), float(t)) for t in range(5)], list(range(5))) == 5
    assert r.offer_many([np.full((1, 1), float(t)) for t in range(3)], list(range(3))) == 3


def test_from_arrays_refuses_infinite_data():
    print("seed=0")
    r = Reservoir(3, 2, 1, random_state=0)
    for t in range(5):
        r.offer(np.full((2, 1), float(t)), t)
    arrays = r.to_arrays()
    arrays["data"][1, 0, 0] = np.inf
    with pytest.raises(ValueError, match="infinities"):
        Reservoir.from_arrays(arrays)


def test_to_arrays_is_a_snapshot_not_the_live_buffer():
    print("seed=0")
    r = Reservoir(2, 1, 1, half_life=1e-9, random_state=0)   # every offer overwrites a slot
    r.offer(np.full((1, 1), 1.0), 0)
    r.offer(np.full((1, 1), 2.0), 1)
    arrays = r.to_arrays()
    before = arrays["data"].copy()
    for t in range(2, 10):
        r.offer(np.full((1, 1), 100.0 + t), t)
    np.testing.assert_array_equal(arrays["data"], before)


def test_a_saved_generator_state_of_floats_is_refused():
    """A bit generator's key must be integers (numpy truncated floats silently)."""
    from streamfhmm.stream.reservoir import generator_from_json, generator_to_json
    state = generator_to_json(np.random.Generator(np.random.MT19937(1)))
    key = state["state"]["key"]
    state["state"]["key"] = {"__array__": [float(v) + 0.5 for v in key["__array__"]], "dtype": "<f8"}
    with pytest.raises(ValueError, match="holds integers"):
        generator_from_json(state)


def test_from_arrays_refuses_huge_values_and_a_state_that_contradicts_like():
    """A saved state with values beyond MAX_ABS_VALUE (which the engine never stores) or
    another capacity / half-life / stride than the reservoir it replaces was taken."""
    print("seed=0")
    r = Reservoir(3, 2, 1, half_life=50.0, stride=2, random_state=0)
    for t in range(5):
        r.offer(np.full((2, 1), float(t)), t)
    arrays = r.to_arrays()
    like = Reservoir(3, 2, 1, half_life=50, stride=2, random_state=1)
    back = Reservoir.from_arrays(arrays, like=like)
    np.testing.assert_array_equal(back.data, r.data)
    big = dict(arrays, data=arrays["data"].copy())
    big["data"][1, 0, 0] = -1e200
    with pytest.raises(ValueError, match=r"within ±1e\+150"):
        Reservoir.from_arrays(big)
    big["data"][1, 0, 0] = np.nan                      # a missing value: kept
    assert np.isnan(Reservoir.from_arrays(big).data[1, 0, 0])
    for other in (Reservoir(4, 2, 1, half_life=50.0, stride=2), Reservoir(3, 2, 1, stride=2),
                  Reservoir(3, 2, 1, half_life=5.0, stride=2),
                  Reservoir(3, 2, 1, half_life=50.0, stride=3)):
        with pytest.raises(ValueError, match="contradict the configuration"):
            Reservoir.from_arrays(arrays, like=other)
    meta = json.loads(str(arrays["meta"]))
    huge = dict(arrays, meta=np.array(json.dumps(dict(meta, capacity=10 ** 12))))
    with pytest.raises(ValueError, match="contradict the configuration"):   # not a MemoryError
        Reservoir.from_arrays(huge, like=like)
