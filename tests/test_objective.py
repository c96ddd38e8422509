"""The composed objective (ELBO ∘ recognition networks): gradients against finite
differences for every parameter block, both window modes, both sharing modes, with and
without missing values; the chunked full-sequence ELBO against the exact likelihood."""
import numpy as np
import pytest

from streamfhmm import exact
from streamfhmm.learn.objective import (ModelPacker, Workspace, batch_objective, constrain_params,
                                        project_covariance, sequence_elbo)
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


def test_objective_checks_its_inputs():
    """sequence_elbo / batch_objective / Workspace / ModelPacker took mismatched inputs to
    the kernels: bounds past the end of Y read past it, a Y narrower than the model or a
    model vector one short gave a finite wrong ELBO, and networks for more chains than
    the packer wrote past the workspace's θ."""
    seed = 7
    params, X, net, packer, ws = _setup(seed, "all", "centred", False)
    vec, w = packer.pack(params), net.weights.copy()
    good = sequence_elbo(vec, w, X, np.array([0, 40]), ws)[0]
    for args, message in [
        ((vec, w, X, np.array([0, 45])), r"bounds must lie in \[0, 40\]"),
        ((vec, w, X[:, :2], np.array([0, 40])), r"Y must have 3 features \(columns\), got 2"),
        ((vec[:-1], w, X, np.array([0, 40])),
         r"model_vec must be a real array of shape \(19,\) for 2 chains and 3 features, got shape \(18,\)"),
        ((vec, w[1:], X, np.array([0, 40])), r"weights must be a real array of shape"),
        # (a NaN gave a NaN ELBO without a word)
        ((np.where(np.arange(19) == 4, np.nan, vec), w, X, np.array([0, 40])),
         r"model_vec must be finite, got nan at index 4"),
        ((vec, np.where(np.arange(w.size) == 0, np.inf, w), X, np.array([0, 40])),
         r"weights must be finite, got inf at index 0"),
        ((vec, w, np.where(np.arange(40)[:, None] == 2, np.inf, X), np.array([0, 40])),
         "Y must not contain infinities"),
    ]:
        with pytest.raises(ValueError, match=message):
            sequence_elbo(*args, ws)
    with pytest.raises(ValueError, match="chunk must be an integer >= 1"):
        sequence_elbo(vec, w, X, np.array([0, 40]), ws, chunk=0)
    # Fortran order is the same data
    assert sequence_elbo(vec, w, np.asfortranarray(X), np.array([0, 40]), ws)[0] == good
    with pytest.raises(ValueError, match="net must have the packer's 2 chains and 3 features, "
                                         "got 5 chains and 3 features"):
        Workspace(packer, RecognitionNet(5, 3, window=5, n_hidden=4))
    for args, message in [((0, 3), "n_chains must be an integer >= 1, got 0"),
                          ((2.7, 3), "n_chains must be an integer >= 1, got 2.7"),
                          ((2, -1), "n_features must be an integer >= 1, got -1")]:
        with pytest.raises(ValueError, match=message):
            ModelPacker(*args)
    with pytest.raises(ValueError, match=r"model_vec must be a real array of shape \(19,\)"):
        packer.unpack(np.concatenate([vec, np.zeros(5)]))
    with pytest.raises(ValueError, match="params must have 2 chains and 3 features like the "
                                         "packer, got 3 and 3"):
        packer.pack(FHMMParams.random(3, 3, random_state=seed))
    # batch_objective: the batch must index Y inside its sequences
    batch = SubchainSampler(np.array([0, 15, 40]), 6, 4, np.random.default_rng(seed)).next_batch()
    args = dict(rows=batch.rows, row_start=batch.row_start, row_end=batch.row_end,
                offsets=batch.offsets, first_is_start=batch.first_is_start)
    ref = batch_objective(vec, w, X, ws=ws, **args)[0]
    for change, message in [
        (dict(rows=batch.rows + 40), "rows must lie in their sequences"),
        (dict(row_end=batch.row_end + 1), "rows must lie in their sequences"),
        (dict(rows=batch.rows[:-1]), "row_start must have the shape of rows"),
        (dict(rows=batch.rows.astype(float)), "rows must be a non-empty 1-D integer array"),
        (dict(offsets=batch.offsets + 1), "offsets must be a 1-D integer array increasing from 0"),
        (dict(first_is_start=batch.first_is_start[:-1]), "first_is_start must be a boolean array"),
    ]:
        with pytest.raises(ValueError, match=message):
            batch_objective(vec, w, X, ws=ws, **{**args, **change})
    with pytest.raises(ValueError, match=r"Y must be a float64 array of shape \(T, 3\)"):
        batch_objective(vec, w, X[:, :2], ws=ws, **args)
    assert batch_objective(vec, w, X, ws=ws, **args)[0] == ref


# -- gaps a mutation run found (each test fails on its mutant) --------------------------------


S = np.array([[1.0, 0.3], [0.3, 3.0]])


def test_project_diag():
    """Project_covariance('diag') keeps the variances; 'spherical' their mean times I."""
    print("seed=none")
    np.testing.assert_array_equal(project_covariance(S, "diag"), np.diag([1.0, 3.0]))


def test_project_spherical():
    """Project_covariance('spherical') is tr(S)/D · I."""
    print("seed=none")
    S = np.array([[1.0, 0.3], [0.3, 3.0]])
    np.testing.assert_allclose(project_covariance(S, "spherical"), 2.0 * np.eye(2))


def test_constrain_spherical_is_mean_variance():
    """Constrain_params('spherical') uses the mean variance, as project_covariance does."""
    seed = 0
    print(f"seed={seed}")
    p = FHMMParams.random(2, 3, random_state=seed)
    q = constrain_params(p, "spherical")
    np.testing.assert_allclose(q.covariance, project_covariance(p.covariance, "spherical"),
                               rtol=1e-12)


def test_integer_vector_accepted():
    """ModelPacker.check_vector accepts an integer array (documented: real = int or float)."""
    print("seed=none")
    pk = ModelPacker(2, 2)
    v = pk.check_vector(np.arange(pk.size))
    assert v.dtype == np.float64
    np.testing.assert_array_equal(v, np.arange(pk.size))


def test_repeated_offset_refused():
    """``batch_objective`` refuses offsets with an empty subchain (strictly increasing)."""
    seed = 0
    print(f"seed={seed}")
    p = FHMMParams.random(2, 3, random_state=seed)
    X, _ = p.sample(40, random_state=1)
    net = RecognitionNet(2, 3, window=5, n_hidden=4).init(random_state=np.random.default_rng(seed))
    net.fit_scaler(X)
    pk = ModelPacker(2, 3)
    ws = Workspace(pk, net)
    b = SubchainSampler(np.array([0, 40]), 6, 4, np.random.default_rng(seed)).next_batch()
    off = np.concatenate([[0], b.offsets])          # subchain 0 empty
    fis = np.concatenate([[True], b.first_is_start])
    with pytest.raises(ValueError, match="offsets must be a 1-D integer array increasing"):
        batch_objective(pk.pack(p), net.weights, X, b.rows, b.row_start, b.row_end, off, fis, ws)
