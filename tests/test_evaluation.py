"""Evaluation helpers: relabelling is an exact symmetry, alignment undoes it."""
import numpy as np
import pytest

from streamfhmm import exact
from streamfhmm.evaluation import align_params, posterior_mae, recovery_errors, relabel
from streamfhmm.model import FHMMParams


def test_relabelling_leaves_the_likelihood_unchanged():
    seed = 3
    print(f"seed={seed}")
    p = FHMMParams.random(3, 2, random_state=seed)
    X, _ = p.sample(200, random_state=seed)
    q = relabel(p, [2, 0, 1], [True, False, True])
    assert exact.log_likelihood(q, X) == pytest.approx(exact.log_likelihood(p, X), rel=1e-12)
    _, th_p = exact.smoothed_marginals(p, X)
    _, th_q = exact.smoothed_marginals(q, X)
    np.testing.assert_allclose(th_q[:, 0], 1 - th_p[:, 2], atol=1e-10)
    np.testing.assert_allclose(th_q[:, 1], th_p[:, 0], atol=1e-10)


def test_align_recovers_the_relabelling():
    p = FHMMParams.random(4, 3, random_state=5)
    q = relabel(p, [3, 1, 0, 2], [False, True, True, False])
    errs = recovery_errors(q, p)
    assert errs["W"] < 1e-12 and errs["transmat"] < 1e-12 and errs["covariance"] < 1e-12
    aligned, perm, flip = align_params(q, p)
    np.testing.assert_allclose(aligned.startprob, p.startprob, atol=1e-12)


def test_posterior_mae_shape_error():
    with pytest.raises(ValueError, match="same shape"):
        posterior_mae(np.zeros((3, 2)), np.zeros((3, 3)))
    assert posterior_mae(np.zeros((2, 2)), np.full((2, 2), 0.25)) == 0.25


def test_align_params_breaks_ties_by_the_switch_probabilities():
    """Two chains with equal (or opposite) w rows: every matching has the same W cost,
    and the Hungarian step kept the identity, reporting a transition error for an
    estimate that is an exact relabelling of the reference."""
    from streamfhmm import FHMM
    A = [[[0.95, 0.05], [0.2, 0.8]], [[0.9, 0.1], [0.3, 0.7]]]
    for W, flip in (([[1.0, 0.0], [1.0, 0.0], [0.5, 0.5]], [False, False]),
                    ([[1.0, 0.0], [-1.0, 0.0], [0.5, 0.5]], [True, True])):
        ref = FHMM.from_params(W=W, covariance=0.1 * np.eye(2), transmat=A).params_
        est = relabel(ref, [1, 0], flip)
        err = recovery_errors(est, ref)
        print(err)
        assert err["W"] < 1e-12 and err["transmat"] < 1e-12 and err["perm"] == [1, 0]
        assert err["flip"] == flip


@pytest.mark.parametrize("perm,flip,message", [
    ([0], [False], r"perm must be a permutation of 0..1 \(one entry per chain\), got \[0\]"),
    ([0, 0], [False, False], r"perm must be a permutation of 0..1"),
    ([-1, 0], [False, False], r"perm must be a permutation of 0..1"),   # W[-1] is the bias
    ([2, 0], [False, False], r"perm must be a permutation of 0..1"),
    ([1.0, 0.0], [False, False], r"perm must be a permutation of 0..1"),
    ([1, 0], [False, False, True], r"flip must be 2 booleans \(one per chain\)"),
    ([1, 0], [0, 1], r"flip must be 2 booleans"),
])
def test_relabel_refuses_what_is_not_a_relabelling(perm, flip, message):
    """A short, repeated or negative perm gave parameters of another model (one chain, a
    chain twice, the bias as a chain); an index past the end was an IndexError."""
    p = FHMMParams.random(2, 3, random_state=0)
    with pytest.raises(ValueError, match=message):
        relabel(p, perm, flip)


def test_evaluation_input_errors():
    p = FHMMParams.random(2, 3, random_state=0)
    with pytest.raises(ValueError, match="params must be an FHMMParams, got NoneType"):
        from streamfhmm.evaluation import loglik_per_step
        loglik_per_step(None, np.zeros((3, 3)))
    with pytest.raises(ValueError, match="estimate must be an FHMMParams, got NoneType"):
        align_params(None, p)
    with pytest.raises(ValueError, match="reference must be an FHMMParams, got dict"):
        recovery_errors(p, {})
    # posterior_mae gave NaN for these
    with pytest.raises(ValueError, match=r"non-empty arrays of shape \(T, M\), got shape \(0, 2\)"):
        posterior_mae(np.zeros((0, 2)), np.zeros((0, 2)))
    with pytest.raises(ValueError, match=r"non-empty arrays of shape \(T, M\), got shape \(4,\)"):
        posterior_mae(np.zeros(4), np.zeros(4))
    with pytest.raises(ValueError, match=r"theta must hold probabilities in \[0, 1\], got nan"):
        posterior_mae([[np.nan, 0.0]], [[0.5, 0.0]])
    with pytest.raises(ValueError, match=r"reference must hold probabilities in \[0, 1\], got 2.0"):
        posterior_mae([[0.5, 0.0]], [[2.0, 0.0]])
    with pytest.raises(ValueError, match="theta must be real-valued"):
        posterior_mae([[0.5 + 0j]], [[0.5]])


def test_loglik_per_step_and_posterior_mae_values():
    """The figures themselves: the exact log-likelihood of several sequences over all
    their steps (T = 20 rows, D = 3 features), and the mean (not the largest) of
    non-uniform absolute differences."""
    from streamfhmm import exact
    from streamfhmm.evaluation import loglik_per_step
    seed = 6
    print(f"seed={seed}")
    p = FHMMParams.random(2, 3, random_state=seed)
    X, _ = p.sample(20, random_state=seed)
    want = (exact.log_likelihood(p, X[:8]) + exact.log_likelihood(p, X[8:])) / 20
    assert loglik_per_step(p, X, [8, 12]) == pytest.approx(want, rel=1e-12)
    a = np.array([[0.0, 0.5], [1.0, 0.25], [0.5, 0.5]])
    b = np.array([[0.1, 0.5], [0.7, 0.25], [0.5, 0.0]])
    assert posterior_mae(a, b) == pytest.approx((0.1 + 0.3 + 0.5) / 6, rel=1e-12)


# -- gaps a mutation run found (each test fails on its mutant) --------------------------------


def test_self_alignment_is_identity_on_tie():
    """on an exact cost tie align_params must keep (not flip) a chain: aligning a model
    with itself (a chain with zero loadings and a == b) must be the identity."""
    W = np.array([[0.0, 0.0], [1.0, -2.0], [0.5, 0.5]])
    A = np.array([[[0.9, 0.1], [0.1, 0.9]], [[0.8, 0.2], [0.3, 0.7]]])
    p = FHMMParams.from_natural(W, np.eye(2) * 0.1, A, startprob=[0.2, 0.6])
    aligned, perm, flip = align_params(p, p)
    assert perm.tolist() == [0, 1]
    assert flip.tolist() == [False, False]
    np.testing.assert_allclose(aligned.startprob, p.startprob, atol=1e-12)


def test_flip_ties_broken_by_swapped_switch_probabilities():
    """a tie between opposite w rows must be broken with the *swapped* switch
    probabilities for the flipped matching."""
    seed = 11
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(3)
    W = np.vstack([w, -w, rng.standard_normal(3)])
    A = np.array([[[0.95, 0.05], [0.3, 0.7]], [[0.6, 0.4], [0.02, 0.98]]])
    ref = FHMMParams.from_natural(W, np.eye(3) * 0.2, A, startprob=[0.3, 0.7])
    # the same model with both chains flipped and swapped: its W rows equal ref's
    est = relabel(ref, [1, 0], [True, True])
    np.testing.assert_allclose(est.W, ref.W, atol=1e-12)
    errs = recovery_errors(est, ref)
    assert errs["perm"] == [1, 0] and errs["flip"] == [True, True]
    assert errs["transmat"] < 1e-12


def test_transmat_error_is_max_abs():
    """recovery_errors['transmat'] is the largest absolute error, not the mean."""
    seed = 2
    print(f"seed={seed}")
    ref = FHMMParams.random(3, 2, random_state=seed, scale=3.0)
    est = ref.replace(alpha=ref.alpha + np.array([0.5, 0.0, 0.0]))
    errs = recovery_errors(est, ref)
    expected = float(np.max(np.abs(est.transmat - ref.transmat)))
    assert expected > 0
    assert errs["transmat"] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("fn", [align_params, recovery_errors])
def test_feature_mismatch_refused(fn):
    """align_params must refuse parameters with different n_features, also when
    numpy broadcasting (D = 1 against D = 3) would let the computation run."""
    seed = 4
    print(f"seed={seed}")
    est = FHMMParams.random(2, 1, random_state=seed)
    ref = FHMMParams.random(2, 3, random_state=seed)
    with pytest.raises(ValueError, match="n_features"):
        fn(est, ref)


def test_align_params_with_chains_of_very_different_scales():
    """The switch-probability tie term was scaled by the largest cost of all pairs: with
    one chain of weight 1e5 it outweighed W differences of order 1 between the small
    chains, and the alignment swapped two chains whose W match exactly (brute force over
    every permutation and flip finds the identity, at W cost 0)."""
    import itertools
    W = np.array([[1e5, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    ref = FHMMParams.from_natural(W, np.eye(2), np.array([[[0.9, 0.1], [0.2, 0.8]],
                                                          [[0.95, 0.05], [0.5, 0.5]],
                                                          [[0.6, 0.4], [0.05, 0.95]]]))
    est = FHMMParams.from_natural(W, np.eye(2), np.array([[[0.9, 0.1], [0.2, 0.8]],
                                                          [[0.6, 0.4], [0.05, 0.95]],
                                                          [[0.95, 0.05], [0.5, 0.5]]]))
    aligned, perm, flip = align_params(est, ref)

    def w_cost(perm, flip):
        return sum(((-1 if f else 1) * est.W[j] - ref.W[i]) @ ((-1 if f else 1) * est.W[j] - ref.W[i])
                   for i, (j, f) in enumerate(zip(perm, flip)))
    best = min(w_cost(p, f) for p in itertools.permutations(range(3))
               for f in itertools.product((False, True), repeat=3))
    assert best == 0.0 and w_cost(perm, flip) == best
    assert perm.tolist() == [0, 1, 2] and not flip.any()
