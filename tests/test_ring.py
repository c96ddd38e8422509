"""The double-written ring buffer against a dictionary of the last samples."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from streamfhmm.kernels import online as ko
from streamfhmm.stream.ring import RingBuffer

from .naive_stream import RingReference


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), C=st.integers(1, 9), D=st.integers(1, 3),
       n=st.integers(1, 40))
def test_windows_are_contiguous_and_current(seed, C, D, n):
    print(f"seed={seed} C={C} D={D} n={n}")
    rng = np.random.default_rng(seed)
    ring, ref = RingBuffer(C, D), RingReference(C)
    for t in range(n):
        x = rng.normal(size=D)
        assert ring.write(t, x) == ko.STATUS_OK
        ref.write(t, x)
        for w in range(1, min(C, t + 1) + 1):
            win = ring.last(t, w)
            np.testing.assert_array_equal(win, ref.last(t, w))
            # the window is one block of the flat buffer
            r = ring.first_row(t, w)
            np.testing.assert_array_equal(ring.flat[r * D:(r + w) * D], ref.last(t, w).ravel())
            assert np.shares_memory(win, ring.buf)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), C=st.integers(1, 9), t0=st.integers(-5, 30),
       n=st.integers(1, 25))
def test_write_block_equals_sequential_writes(seed, C, t0, n):
    print(f"seed={seed} C={C} t0={t0} n={n}")
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    a, b = RingBuffer(C, 2), RingBuffer(C, 2)
    a.fill(np.array([7.0, 8.0]))
    b.fill(np.array([7.0, 8.0]))
    a.write_block(t0, X)
    for i in range(n):
        b.write(t0 + i, X[i])
    np.testing.assert_array_equal(a.buf, b.buf)


def test_fill_pads_positions_before_a_start():
    ring = RingBuffer(5, 2)
    ring.fill(np.array([1.0, 2.0]))
    ring.write(0, np.array([3.0, 4.0]))
    np.testing.assert_array_equal(ring.last(0, 3), [[1, 2], [1, 2], [3, 4]])


def test_infinite_sample_is_not_written():
    ring = RingBuffer(3, 2)
    assert ring.write(0, np.array([np.nan, 1.0])) == ko.STATUS_MISSING
    before = ring.buf.copy()
    assert ring.write(1, np.array([np.inf, 1.0])) == ko.STATUS_INFINITE
    np.testing.assert_array_equal(ring.buf, before)


def test_round_trip_and_errors():
    ring = RingBuffer(4, 3)
    for t in range(6):
        ring.write(t, np.full(3, float(t)))
    back = RingBuffer.from_arrays(ring.to_arrays()["buf"])
    np.testing.assert_array_equal(back.buf, ring.buf)
    assert back.capacity == 4
    with pytest.raises(ValueError, match="w must be in"):
        ring.last(5, 5)
    with pytest.raises(ValueError, match="shape"):
        RingBuffer.from_arrays(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="capacity"):
        RingBuffer(0, 2)


# -- gaps a mutation run found (each test fails on its mutant) --------------------------------
def test_last_refuses_an_empty_window():
    ring = RingBuffer(4, 2)
    with pytest.raises(ValueError, match="w must be in"):
        ring.last(3, 0)


def test_to_arrays_is_a_snapshot_not_the_live_buffer():
    ring = RingBuffer(3, 1)
    for t in range(3):
        ring.write(t, np.array([float(t)]))
    saved = ring.to_arrays()["buf"]
    before = saved.copy()
    ring.write(3, np.array([99.0]))
    np.testing.assert_array_equal(saved, before)


def test_from_arrays_refuses_a_buffer_that_is_not_2_d():
    with pytest.raises(ValueError, match="shape"):
        RingBuffer.from_arrays(np.zeros(4))


def test_slot_is_the_row_written_and_its_copy_c_rows_on():
    C = 4
    ring = RingBuffer(C, 1)
    for t in range(11):
        ring.write(t, np.array([float(t)]))
        s = ring.slot(t)
        assert ring.buf[s, 0] == t and ring.buf[s + C, 0] == t


def test_fill_pads_a_sequence_starting_mid_stream():
    """fill sets both copies of every row: a sequence starting at position 2 reads the
    positions before it from rows >= C."""
    ring = RingBuffer(5, 1)
    ring.fill(np.array([7.0]))
    ring.write(2, np.array([1.0]))
    np.testing.assert_array_equal(ring.last(2, 5)[:, 0], [7, 7, 7, 7, 1])
