"""The composed objective (ELBO ∘ recognition networks): gradients against finite
differences for every parameter block, both window modes, both sharing modes, with and
without missing values; the chunked full-sequence ELBO against the exact likelihood."""
import numpy as np
import pytest

from streamfhmm import exact
from streamfhmm.learn.objective import ModelPacker, Workspace, batch_objective, sequence_elbo
from streamfhmm.learn.sampler import SubchainSampler
from streamfhmm.model import FHMMParams
from streamfhmm.network import RecognitionNet


def _setup(seed, share, mode, missing, M=2, D=3, T=40):
    print(f"seed={seed} share={share} mode={mode} missing={missing}")
    rng = np.random.default_rng(seed)
    params = FHMMParams.random(M, D, random_state=seed, noise=0.6)
    X, _ = params.sample(T, random_state=seed + 1)
    if missing:
        mask = rng.random(X.shape) < 0.15
        mask[mask.all(axis=1), 0] = False
        X[mask] = np.nan
    net = RecognitionNet(M, D, window=5, n_hidden=4, share=share, mode=mode)
    net.init(random_state=seed, output_scale=1.0)
    net.weights = net.weights + 0.3 * rng.standard_normal(net.n_weights)
    net.fit_scaler(X)
    packer = ModelPacker(M, D)
    return params, X, net, packer, Workspace(packer, net)


def _fd_check(f, x, grad, idx, step=1e-6, rtol=1e-6):
    for i in idx:
        xp, xm = x.copy(), x.copy()
        xp[i] += step
        xm[i] -= step
        fd = (f(xp) - f(xm)) / (2 * step)
        scale = max(abs(fd), abs(grad[i]), 1e-3)
        assert abs(fd - grad[i]) / scale <= rtol, (i, fd, grad[i])


@pytest.mark.parametrize("share", ["all", "chain"])
@pytest.mark.parametrize("mode", ["centred", "causal"])
@pytest.mark.parametrize("missing", [False, True])
def test_gradients_against_finite_differences(share, mode, missing):
    seed = 100 + 10 * (share == "chain") + 2 * (mode == "causal") + missing
    params, X, net, packer, ws = _setup(seed, share, mode, missing)
    bounds = np.array([0, 15, 40])
    sampler = SubchainSampler(bounds, 6, 4, np.random.default_rng(seed))
    batch = sampler.next_batch()
    vec = packer.pack(params)
    w = net.weights.copy()

    def value(v, weights):
        return batch_objective(v, weights, X, batch.rows, batch.row_start, batch.row_end,
                               batch.offsets, batch.first_is_start, ws)[0]

    _, gm, gn = batch_objective(vec, w, X, batch.rows, batch.row_start, batch.row_end,
                                batch.offsets, batch.first_is_start, ws)
    gm, gn = gm.copy(), gn.copy()
    # every model parameter
    _fd_check(lambda v: value(v, w), vec, gm, range(packer.size))
    # a random sample of network weights from every block
    rng = np.random.default_rng(seed)
    lay = net.layout
    from streamfhmm.kernels import recognition as rk
    blocks = [(lay[rk.LAYOUT_OFF_U], lay[rk.LAYOUT_OFF_C]), (lay[rk.LAYOUT_OFF_C], lay[rk.LAYOUT_OFF_V]),
              (lay[rk.LAYOUT_OFF_V], lay[rk.LAYOUT_OFF_E]), (lay[rk.LAYOUT_OFF_E], lay[rk.LAYOUT_N_WEIGHTS])]
    idx = np.concatenate([rng.choice(np.arange(a, b), size=min(8, b - a), replace=False) for a, b in blocks])
    _fd_check(lambda ww: value(vec, ww), w, gn, idx)


def test_packer_round_trip():
    p = FHMMParams.random(3, 4, random_state=1)
    packer = ModelPacker(3, 4)
    q = packer.unpack(packer.pack(p))
    np.testing.assert_allclose(q.W, p.W)
    np.testing.assert_allclose(q.L, p.L, rtol=1e-14)
    np.testing.assert_allclose(q.alpha, p.alpha)
    np.testing.assert_allclose(q.startprob, p.stationary, rtol=1e-14)


@pytest.mark.parametrize("chunk", [7, 1000])
def test_sequence_elbo_is_a_bound_and_chunking_is_exact(chunk):
    params, X, net, packer, ws = _setup(5, "chain", "centred", False, T=60)
    params = params.replace(startprob=params.stationary)
    bounds = np.array([0, 25, 60])
    vec = packer.pack(params)
    v_chunk, grads = sequence_elbo(vec, net.weights, X, bounds, ws, chunk=chunk, with_grad=True)
    v_whole, _ = sequence_elbo(vec, net.weights, X, bounds, ws, chunk=10_000)
    assert v_chunk == pytest.approx(v_whole, rel=1e-12)
    ll = exact.log_likelihood(params, X, [25, 35])
    print(f"elbo {v_chunk:.6f} <= loglik {ll:.6f}")
    assert v_chunk <= ll + 1e-9
    # the gradient of the whole-sequence ELBO is the sum of the chunk gradients
    _, g_whole = sequence_elbo(vec, net.weights, X, bounds, ws, chunk=10_000, with_grad=True)
    np.testing.assert_allclose(grads[0], g_whole[0], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(grads[1], g_whole[1], rtol=1e-9, atol=1e-9)
