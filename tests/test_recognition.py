"""Recognition networks (MATH.md §3): kernels against the loop reference, gradients
against finite differences, and the RecognitionNet API."""
import io

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from streamfhmm.kernels import recognition as rk
from streamfhmm.network import RecognitionNet

from . import naive_recognition as naive

SHARES = ("all", "chain")
MODES = ("centred", "causal")


def _net(M, D, window, Hg, share, mode, seed, weight_scale=0.7):
    """A network with spread-out random weights and a random scaler."""
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    net = RecognitionNet(M, D, window=window, n_hidden=Hg, share=share, mode=mode)
    net.weights = weight_scale * rng.standard_normal(net.n_weights)
    net.set_scaler(rng.normal(size=D), 0.5 + rng.random(D))
    return net


def _data(lengths, D, seed, nan_fraction=0.0):
    print(f"data seed={seed}")
    rng = np.random.default_rng(seed)
    Y = rng.normal(size=(int(np.sum(lengths)), D)) * 2.0 + 0.5
    if nan_fraction:
        mask = rng.random(Y.shape) < nan_fraction
        mask[mask.all(axis=1), 0] = False  # keep one observed value per row
        Y[mask] = np.nan
    return Y


def _naive_forward(net, Y, lengths):
    return naive.forward(Y, lengths, net.weights, net.n_chains, net.window, net.n_hidden,
                         net.share, net.mode, net.mean, net.scale)


def _bounds(lengths):
    ends = np.cumsum(lengths)
    sid = np.repeat(np.arange(len(lengths)), lengths)
    return (ends - np.asarray(lengths))[sid].astype(np.int64), ends[sid].astype(np.int64)


# ------------------------------------------------------------------------ forward
@pytest.mark.parametrize("share", SHARES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("nan_fraction", [0.0, 0.2])
@pytest.mark.parametrize("lengths", [[11], [3, 1, 12, 7]])
def test_forward_matches_naive(share, mode, nan_fraction, lengths):
    net = _net(3, 2, 5, 4, share, mode, seed=1)
    Y = _data(lengths, 2, seed=2, nan_fraction=nan_fraction)
    theta, rho = net.forward(Y, lengths, chunk_size=4)  # several chunks
    theta_ref, rho_ref = _naive_forward(net, Y, lengths)
    np.testing.assert_allclose(theta, theta_ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(rho, rho_ref, rtol=0, atol=1e-12)
    # the weights are large enough that the outputs are spread, not all ~0.5 / ~0
    assert theta.std() > 0.1 and rho.std() > 0.1


@pytest.mark.parametrize("share", SHARES)
def test_forward_matches_naive_over_several_blocks(share):
    """One forward_batch call of 600 windows spans three of the kernel's blocks of 256
    (every other test's calls hold fewer than 256): windows 256 on must match too (a
    second block that read the first block's hidden units was let through)."""
    from streamfhmm.kernels.recognition import _FORWARD_BLOCK
    seed = 12
    print(f"seed={seed}")
    lengths = [600]
    assert lengths[0] > 2 * _FORWARD_BLOCK
    net = _net(3, 2, 5, 4, share, "centred", seed=seed)
    Y = _data(lengths, 2, seed=seed + 1, nan_fraction=0.1)
    theta, rho = net.forward(Y, lengths, chunk_size=len(Y))     # one call
    theta_ref, rho_ref = _naive_forward(net, Y, lengths)
    np.testing.assert_allclose(theta, theta_ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(rho, rho_ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_build_windows_matches_naive(mode):
    seed = 3
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    lengths = [4, 1, 9]
    D, window = 3, 7
    Y = _data(lengths, D, seed=seed, nan_fraction=0.2)
    mean, scale = rng.normal(size=D), 0.5 + rng.random(D)
    seq_start, seq_end = _bounds(lengths)
    positions = rng.integers(0, Y.shape[0], size=40).astype(np.int64)  # shuffled, repeats
    out = np.full((positions.size, window * D), np.nan)
    rk.build_windows(Y, seq_start[positions], seq_end[positions], positions, window,
                     naive.offset_of(window, mode), mean, scale, out)
    for i, t in enumerate(positions):
        raw = naive.raw_window(Y, t, seq_start[t], seq_end[t], window, mode)
        np.testing.assert_allclose(out[i], naive.standardise(raw, mean, scale), rtol=0, atol=1e-15)


def test_consecutive_windows_match_build_windows():
    """Consecutive rows of one sequence: the same windows as build_windows (and the
    naive stacking), bit for bit."""
    seed = 8
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    D, window, n = 3, 7, 25
    Z = _data([n + window - 1], D, seed=seed, nan_fraction=0.2)
    mean, scale = rng.normal(size=D), 0.5 + rng.random(D)
    out = np.full((n, window * D), np.nan)
    zs = np.full((n + window + 3, D), np.nan)
    rk.consecutive_windows(Z, window, mean, scale, zs, out)
    ref = np.full_like(out, np.nan)
    positions = np.arange(n, dtype=np.int64)
    rk.build_windows(Z, np.zeros(n, np.int64), np.full(n, Z.shape[0], np.int64), positions,
                     window, 0, mean, scale, ref)
    np.testing.assert_array_equal(out, ref)
    for i in range(n):
        raw = Z[i:i + window]
        np.testing.assert_allclose(out[i], naive.standardise(raw, mean, scale), rtol=0, atol=1e-15)


@pytest.mark.parametrize("share", SHARES)
@pytest.mark.parametrize("mode", MODES)
def test_forward_batch_at_arbitrary_positions(share, mode):
    lengths = [6, 2, 10]
    net = _net(4, 3, 5, 6, share, mode, seed=4)
    Y = _data(lengths, 3, seed=5, nan_fraction=0.1)
    seq_start, seq_end = _bounds(lengths)
    print("seed=6")
    positions = np.random.default_rng(6).permutation(Y.shape[0]).astype(np.int64)
    n = positions.size
    Xw = np.empty((n, net.n_inputs))
    rk.build_windows(Y, seq_start[positions], seq_end[positions], positions, net.window,
                     net.offset, net.mean, net.scale, Xw)
    theta, rho = np.empty((n, 4)), np.empty((n, 4))
    hidden = np.empty((n, net.n_groups * net.n_hidden))
    rk.forward_batch(Xw, net.weights, net.layout, theta, rho, hidden)
    theta_ref, rho_ref = _naive_forward(net, Y, lengths)
    np.testing.assert_allclose(theta, theta_ref[positions], rtol=0, atol=1e-12)
    np.testing.assert_allclose(rho, rho_ref[positions], rtol=0, atol=1e-12)
    # hidden activations, group by group
    U, c, _, _ = naive.unpack(net.weights, 4, 3, net.window, net.n_hidden, share)
    for g in range(net.n_groups):
        z = np.tanh(Xw @ U[g].T + c[g])
        np.testing.assert_allclose(hidden[:, g * net.n_hidden:(g + 1) * net.n_hidden], z,
                                   rtol=0, atol=1e-13)


@pytest.mark.parametrize("share", SHARES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("nan_fraction", [0.0, 0.2])
def test_forward_one_matches_naive_and_batch(share, mode, nan_fraction):
    lengths = [2, 13]
    M, D = 3, 2
    net = _net(M, D, 5, 5, share, mode, seed=7)
    Y = _data(lengths, D, seed=8, nan_fraction=nan_fraction)
    seq_start, seq_end = _bounds(lengths)
    theta_ref, rho_ref = _naive_forward(net, Y, lengths)
    theta_batch, rho_batch = net.forward(Y, lengths)
    print("seed=9")
    rng = np.random.default_rng(9)
    buf = rng.normal(size=400)  # a flat buffer; the window sits at an arbitrary offset
    scratch = np.full(net.scratch_size, np.nan)
    theta, rho = np.empty(M), np.empty(M)
    K = net.n_inputs
    for t in range(Y.shape[0]):
        start = int(rng.integers(0, buf.size - K))
        buf[start:start + K] = naive.raw_window(Y, t, seq_start[t], seq_end[t], net.window,
                                                mode).ravel()
        rk.forward_one(buf, start, net.weights, net.layout, net.mean, net.scale, scratch,
                       theta, rho)
        np.testing.assert_allclose(theta, theta_ref[t], rtol=0, atol=1e-12)
        np.testing.assert_allclose(rho, rho_ref[t], rtol=0, atol=1e-12)
        np.testing.assert_allclose(theta, theta_batch[t], rtol=0, atol=1e-13)
        np.testing.assert_allclose(rho, rho_batch[t], rtol=0, atol=1e-13)


@settings(max_examples=25, deadline=None)
@given(M=st.integers(1, 4), D=st.integers(1, 3), h=st.integers(0, 3), Hg=st.integers(1, 6),
       share=st.sampled_from(SHARES), mode=st.sampled_from(MODES),
       lengths=st.lists(st.integers(1, 9), min_size=1, max_size=3),
       seed=st.integers(0, 2**31 - 1))
def test_forward_random_shapes(M, D, h, Hg, share, mode, lengths, seed):
    net = _net(M, D, 2 * h + 1, Hg, share, mode, seed=seed)
    Y = _data(lengths, D, seed=seed + 1, nan_fraction=0.15 if D > 1 else 0.0)
    theta, rho = net.forward(Y, lengths, chunk_size=5)
    theta_ref, rho_ref = _naive_forward(net, Y, lengths)
    np.testing.assert_allclose(theta, theta_ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(rho, rho_ref, rtol=0, atol=1e-12)
    if lengths[-1] >= net.window:  # a whole window at the end of the last sequence
        t = Y.shape[0] - 1 - net.lag
        th1, rh1 = net.forward_window(Y[t - net.offset:t - net.offset + net.window])
        np.testing.assert_allclose(th1, theta[t], rtol=0, atol=1e-13)
        np.testing.assert_allclose(rh1, rho[t], rtol=0, atol=1e-13)


def test_forward_window_pads_like_forward():
    net = _net(2, 3, 7, 8, "all", "causal", seed=10)
    Y = _data([5], 3, seed=11, nan_fraction=0.2)
    theta, rho = net.forward(Y)
    # causal window at t = 1: rows -5..1 clamp to row 0
    x = np.vstack([Y[[0] * 6], Y[1:2]])
    th, rh = net.forward_window(x)
    np.testing.assert_allclose(th, theta[1], rtol=0, atol=1e-13)
    np.testing.assert_allclose(rh, rho[1], rtol=0, atol=1e-13)


# ----------------------------------------------------------------------- backward
def _objective(net, Xw, g_theta, g_rho, weights):
    n, M = g_theta.shape
    theta, rho = np.empty((n, M)), np.empty((n, M))
    hidden = np.empty((n, net.n_groups * net.n_hidden))
    rk.forward_batch(Xw, weights, net.layout, theta, rho, hidden)
    return float(np.sum(g_theta * theta) + np.sum(g_rho * rho))


@pytest.mark.parametrize("share", SHARES)
def test_backward_against_finite_differences(share):
    seed = 12
    M, D, window, Hg, n = 3, 2, 3, 4, 9
    net = _net(M, D, window, Hg, share, "centred", seed=seed, weight_scale=0.6)
    rng = np.random.default_rng(seed + 1)
    Y = _data([n], D, seed=seed + 2, nan_fraction=0.1)
    positions = np.arange(n, dtype=np.int64)
    Xw = np.empty((n, net.n_inputs))
    rk.build_windows(Y, np.zeros(n, np.int64), np.full(n, n, np.int64), positions, window,
                     net.offset, net.mean, net.scale, Xw)
    g_theta, g_rho = rng.normal(size=(n, M)), rng.normal(size=(n, M))
    theta, rho = np.empty((n, M)), np.empty((n, M))
    hidden = np.empty((n, net.n_groups * Hg))
    rk.forward_batch(Xw, net.weights, net.layout, theta, rho, hidden)
    grad = np.full(net.n_weights, 123.0)  # garbage: backward_batch overwrites
    rk.backward_batch(Xw, hidden, theta, rho, g_theta, g_rho, net.weights, net.layout, grad)

    step = 1e-5
    fd = np.empty(net.n_weights)
    w = net.weights.copy()
    for i in range(w.size):
        wp, wm = w.copy(), w.copy()
        wp[i] += step
        wm[i] -= step
        fd[i] = (_objective(net, Xw, g_theta, g_rho, wp)
                 - _objective(net, Xw, g_theta, g_rho, wm)) / (2 * step)
    lay = net.layout
    blocks = {"U": (lay[rk.LAYOUT_OFF_U], lay[rk.LAYOUT_OFF_C]),
              "c": (lay[rk.LAYOUT_OFF_C], lay[rk.LAYOUT_OFF_V]),
              "V": (lay[rk.LAYOUT_OFF_V], lay[rk.LAYOUT_OFF_E]),
              "e": (lay[rk.LAYOUT_OFF_E], lay[rk.LAYOUT_N_WEIGHTS])}
    for name, (a, b) in blocks.items():
        err = np.linalg.norm(grad[a:b] - fd[a:b]) / np.linalg.norm(fd[a:b])
        print(f"{share} {name}: relative error {err:.2e}")
        assert np.linalg.norm(fd[a:b]) > 1e-3, name
        assert err <= 1e-6, (name, err)
    # with one group per chain, a head never depends on another chain's units
    if share == "chain":
        U, c, V, e = naive.unpack(grad, M, D, window, Hg, share)
        g_theta0 = g_theta.copy()
        g_theta0[:, 1:] = 0.0
        g_rho0 = np.zeros_like(g_rho)
        rk.backward_batch(Xw, hidden, theta, rho, g_theta0, g_rho0, net.weights, net.layout, grad)
        U, c, V, e = naive.unpack(grad, M, D, window, Hg, share)
        assert np.all(U[1:] == 0) and np.all(c[1:] == 0) and np.all(V[1:] == 0)
        assert np.all(V[0, 1] == 0) and np.all(e[0, 1] == 0) and np.any(U[0] != 0)


# ---------------------------------------------------------------------------- API
def test_init_starts_near_half_and_given_rho():
    net = RecognitionNet(4, 3, window=5, n_hidden=10, share="chain").init(
        random_state=0, rho_init=0.3, output_scale=0.0)
    Y = _data([20], 3, seed=13)
    theta, rho = net.forward(Y)
    np.testing.assert_allclose(theta, 0.5, rtol=0, atol=1e-15)
    np.testing.assert_allclose(rho, 0.3, rtol=0, atol=1e-14)
    net.init(random_state=0, theta_init=0.2, rho_init=-0.5)
    theta, rho = net.forward(Y)
    # head weights ~ 0.1 N(0, 1/Hg): pre-activations move by about 0.1
    assert np.abs(theta - 0.2).max() < 0.1 and np.abs(rho + 0.5).max() < 0.3
    assert abs(theta.mean() - 0.2) < 0.02 and abs(rho.mean() + 0.5) < 0.05
    assert np.any(net.U != 0) and np.all(net.c == 0)
    a = RecognitionNet(2, 2).init(random_state=5).weights.copy()
    b = RecognitionNet(2, 2).init(random_state=5).weights
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("share", SHARES)
def test_head_mapping_and_views(share):
    M = 3
    net = _net(M, 2, 3, 4, share, "centred", seed=14)
    Y = _data([8], 2, seed=15)
    theta0, rho0 = net.forward(Y)
    for m in range(M):
        for which in ("theta", "rho"):
            g, p = net.head(m, which)
            view = net.e_theta if which == "theta" else net.e_rho
            assert np.shares_memory(view, net.weights)
            old = net.e[g, p]
            view[m] += 0.5  # the accessor and (g, p) address the same weight
            assert net.e[g, p] == old + 0.5
            theta, rho = net.forward(Y)
            changed = theta if which == "theta" else rho
            other = rho if which == "theta" else theta
            ref = theta0 if which == "theta" else rho0
            assert np.all(changed[:, m] != ref[:, m])
            np.testing.assert_array_equal(np.delete(changed, m, axis=1), np.delete(ref, m, axis=1))
            np.testing.assert_array_equal(other, rho0 if which == "theta" else theta0)
            view[m] = old  # restore exactly
            net.weights = net.weights  # round trip through the setter
    Vt, Vr = net.V_theta, net.V_rho
    assert Vt.shape == (M, 4) and Vr.shape == (M, 4)
    assert np.shares_memory(Vt, net.weights) and np.shares_memory(Vr, net.weights)
    for m in range(M):
        g, p = net.head(m, "rho")
        np.testing.assert_array_equal(Vr[m], net.V[g, p])


def test_weights_setter_keeps_views_and_copy_is_independent():
    net = _net(2, 2, 3, 3, "all", "causal", seed=16)
    U = net.U
    new = np.arange(net.n_weights, dtype=float)
    net.weights = new
    assert np.shares_memory(U, net.weights) and U.ravel()[0] == 0.0 and U.ravel()[1] == 1.0
    clone = net.copy()
    clone.weights[:] = 0.0
    clone.mean[:] = 9.0
    assert net.weights[1] == 1.0 and net.mean[0] != 9.0
    assert repr(clone) == repr(net)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_deepcopy_and_pickle_keep_the_views_on_the_weights(how):
    """Copied attribute by attribute, U, c, V, e and the heads were arrays of their own:
    init() and the weights setter then changed the weights and not the views (or the
    reverse), and the forward pass read stale weights."""
    import copy
    import pickle
    net = _net(2, 2, 3, 3, "all", "centred", seed=19)
    twin = copy.deepcopy(net) if how == "deepcopy" else pickle.loads(pickle.dumps(net))
    assert np.shares_memory(twin.U, twin.weights) and not np.shares_memory(twin.weights, net.weights)
    np.testing.assert_array_equal(twin.weights, net.weights)
    np.testing.assert_array_equal(twin.scale, net.scale)
    twin.weights = np.zeros(net.n_weights)
    assert not twin.U.any()
    twin.init(random_state=5)
    assert twin.weights.any() and np.shares_memory(twin.U, twin.weights)
    Y = _data([9], 2, seed=20)
    np.testing.assert_array_equal(copy.deepcopy(net).forward(Y)[0], net.forward(Y)[0])


@pytest.mark.parametrize("share,mode", [("all", "centred"), ("chain", "causal")])
def test_arrays_round_trip_through_npz(share, mode):
    net = _net(3, 2, 5, 4, share, mode, seed=17)
    f = io.BytesIO()
    np.savez(f, **net.to_arrays())
    f.seek(0)
    with np.load(f, allow_pickle=False) as data:
        back = RecognitionNet.from_arrays(data)
    assert (back.n_chains, back.n_features, back.window, back.n_hidden, back.share,
            back.mode) == (3, 2, 5, 4, share, mode)
    np.testing.assert_array_equal(back.weights, net.weights)
    np.testing.assert_array_equal(back.mean, net.mean)
    np.testing.assert_array_equal(back.scale, net.scale)
    Y = _data([7], 2, seed=18)
    for a, b in zip(back.forward(Y), net.forward(Y)):
        np.testing.assert_array_equal(a, b)


def test_fit_scaler():
    Y = np.array([[1.0, 5.0, np.nan], [3.0, 5.0, 2.0], [np.nan, 5.0, 4.0]])
    net = RecognitionNet(1, 3).fit_scaler(Y)
    np.testing.assert_allclose(net.mean, [2.0, 5.0, 3.0], rtol=1e-15)
    np.testing.assert_allclose(net.scale, [1.0, 1.0, 1.0], rtol=1e-15)  # constant feature: 1
    Y2 = np.array([[0.0], [4.0]])
    net2 = RecognitionNet(1, 1).fit_scaler(Y2)
    assert net2.mean[0] == 2.0 and net2.scale[0] == 2.0
    # a constant 0.1 has a standard deviation of about 1e-17 in floating point, not 0:
    # still constant (a scale of 1e-17 would blow its inputs up to about 1)
    net3 = RecognitionNet(1, 2).fit_scaler(np.array([[0.1, 1.0], [0.1, 2.0], [0.1, 4.0]]))
    assert net3.scale[0] == 1.0 and net3.scale[1] == pytest.approx(np.std([1.0, 2.0, 4.0]), rel=1e-14)


@pytest.mark.parametrize("v", [1e-200, 1e-160, 1e160, 1e300])
def test_fit_scaler_in_any_units(v):
    """The scale of ±v is v at any magnitude check_observations takes: the squared
    deviations underflowed (±1e-200 was taken for constant, ±1e-160 lost 6 digits) or
    overflowed (±1e160 gave an infinite scale, refused by set_scaler)."""
    Y = np.array([[v, 3.0], [-v, 1.0], [np.nan, 2.0]])
    net = RecognitionNet(1, 2).fit_scaler(Y)
    assert net.scale[0] == pytest.approx(v, rel=1e-14) and net.mean[0] == 0.0
    assert net.scale[1] == pytest.approx(np.std([3.0, 1.0, 2.0]), rel=1e-14)


def _bad(**kw):
    args = dict(n_chains=2, n_features=3, window=5, n_hidden=4, share="all", mode="centred")
    args.update(kw)
    return lambda: RecognitionNet(**args)


_NET = RecognitionNet(2, 3, window=5, n_hidden=4)


@pytest.mark.parametrize("make,match", [
    (_bad(n_chains=0), "n_chains must be an integer >= 1"),
    (_bad(n_chains=2.5), "n_chains must be an integer"),
    (_bad(n_features=True), "n_features must be an integer"),
    (_bad(window=4), r"window must be an odd integer >= 1 \(2h \+ 1 samples\), got 4"),
    (_bad(window=0), "window must be an integer >= 1"),
    (_bad(n_hidden=0), "n_hidden must be an integer >= 1"),
    (_bad(share="group"), "share must be one of 'all', 'chain', got 'group'"),
    (_bad(mode="centered"), "mode must be one of 'centred', 'causal', got 'centered'"),
    (lambda: setattr(_NET, "weights", np.zeros(3)), r"weights must have shape \(84,\)"),
    (lambda: setattr(_NET, "weights", np.full(84, np.inf)), "weights must be finite"),
    (lambda: _NET.set_scaler(np.zeros(2), np.ones(3)), r"mean must have shape \(3,\)"),
    (lambda: _NET.set_scaler(np.zeros(3), [1.0, 0.0, 1.0]), "scale must be finite and positive"),
    (lambda: _NET.init(rho_init=1.0), r"rho_init must be a finite number in \[-0.999, 0.999\], got 1.0"),
    (lambda: _NET.init(theta_init=0.0), r"theta_init must be a finite number in \[0.001, 0.999\], got 0.0"),
    # (θ stuck at its bound: a head bias of -690 and a gradient of 1e-300)
    (lambda: _NET.init(theta_init=1e-8), r"theta_init must be a finite number in \[0.001, 0.999\], got 1e-08"),
    (lambda: _NET.init(theta_init=0.9999), r"theta_init must be a finite number in \[0.001, 0.999\]"),
    (lambda: _NET.init(rho_init=-0.9999999), r"rho_init must be a finite number in \[-0.999, 0.999\]"),
    (lambda: _NET.init(output_scale=-1.0), r"output_scale must be a finite number in \[0, inf\)"),
    (lambda: _NET.init(random_state="x"), "random_state must be None, an int"),
    (lambda: _NET.forward(np.zeros((4, 2))), r"Y must have 3 features"),
    (lambda: _NET.forward(np.zeros((4, 3)), lengths=[2, 1]), "lengths must sum"),
    (lambda: _NET.forward(np.zeros((4, 3)), chunk_size=0), "chunk_size must be an integer >= 1"),
    (lambda: _NET.forward_window(np.zeros((4, 3))), r"x must have shape \(5, 3\)"),
    (lambda: _NET.forward_window(np.full((5, 3), np.inf)), "x must not contain infinities"),
    (lambda: _NET.head(2, "theta"), r"chain must be an integer in \[0, 2\)"),
    (lambda: _NET.head(0, "mu"), "which must be one of 'theta', 'rho'"),
    (lambda: RecognitionNet.from_arrays({"n_chains": 1}), "arrays is missing n_features"),
    (lambda: RecognitionNet.from_arrays([1, 2]), "arrays must be a mapping"),
])
def test_validation_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()
    # a failed assignment leaves the network untouched
    assert np.all(np.isfinite(_NET.weights)) and np.all(_NET.scale == 1.0)


# -- gaps a mutation run found (each test fails on its mutant) --------------------------------


def test_init_resets_hidden_bias():
    """init sets the hidden biases c to 0, whatever they held before."""
    seed = 7
    print(f"seed={seed}")
    net = RecognitionNet(2, 3, window=3, n_hidden=4)
    net.weights = np.random.default_rng(seed).standard_normal(net.n_weights)
    net.init(random_state=seed)
    assert np.all(net.c == 0.0)
    fresh = RecognitionNet(2, 3, window=3, n_hidden=4).init(random_state=seed)
    np.testing.assert_array_equal(net.weights, fresh.weights)


def test_tiny_units_not_taken_for_constant():
    """fit_scaler's constant test is relative to the data's magnitude: a varying feature
    in units of 1e-13 gets its own standard deviation as scale, not 1."""
    seed = 3
    print(f"seed={seed}")
    Y = 1e-13 * np.random.default_rng(seed).standard_normal((200, 2))
    net = RecognitionNet(1, 2, window=1, n_hidden=2).fit_scaler(Y)
    np.testing.assert_allclose(net.scale, Y.std(axis=0), rtol=1e-10)


def test_copy_keeps_scaler():
    """RecognitionNet.copy copies the scaler's scale."""
    net = RecognitionNet(2, 3, window=3, n_hidden=4).init(random_state=0)
    net.set_scaler([1.0, 2.0, 3.0], [0.5, 4.0, 2.0])
    c = net.copy()
    np.testing.assert_array_equal(c.mean, net.mean)
    np.testing.assert_array_equal(c.scale, net.scale)
    Y = np.random.default_rng(0).standard_normal((20, 3))
    for a, b in zip(c.forward(Y), net.forward(Y)):
        np.testing.assert_array_equal(a, b)


def test_to_arrays_weights_are_a_copy():
    """to_arrays returns copies: changing them leaves the network unchanged."""
    net = RecognitionNet(2, 3, window=3, n_hidden=4).init(random_state=0)
    before = net.weights.copy()
    arrays = net.to_arrays()
    arrays["weights"][:] = 0.0
    arrays["mean"][:] = 9.0
    np.testing.assert_array_equal(net.weights, before)
    assert np.all(net.mean == 0.0)


def test_wrong_n_features_refused():
    """check_net refuses a network with the right n_chains but the wrong n_features."""
    from streamfhmm.network import check_net
    net = RecognitionNet(2, 3, window=3, n_hidden=4)
    assert check_net(net, 2, 3) is net
    with pytest.raises(ValueError, match="3 features"):
        check_net(net, 2, 4)
