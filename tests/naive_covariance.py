"""Slow, obviously-correct references for the covariance families ("full", "diag",
"spherical"): the constrained parameterisation written out entry by entry, and the
constrained SMF M-step for Σ as a loop over time (MATH.md §1, §6).

Nothing here imports the modules it checks.
"""
from __future__ import annotations

import numpy as np


def n_free_cov(D: int, covariance_type: str) -> int:
    """Free covariance parameters: D(D+1)/2 (full), D (diag), 1 (spherical)."""
    return {"full": D * (D + 1) // 2, "diag": D, "spherical": 1}[covariance_type]


def embed(z, M: int, D: int, covariance_type: str) -> np.ndarray:
    """The flat model vector of the constrained parameters ``z``.

    ``z`` = W (M+1)·D | covariance parameters (λ_1..λ_D for diag, one λ for spherical) |
    α (M) | β (M). The result has the learner's layout: W | L's lower triangle row by row
    with the diagonal as λ_d and every off-diagonal entry 0 | α | β.
    """
    z = np.asarray(z, dtype=np.float64)
    nW = (M + 1) * D
    nc = n_free_cov(D, covariance_type)
    out = [z[:nW]]
    lam = z[nW:nW + nc]
    for i in range(D):
        for j in range(i + 1):
            if i != j:
                out.append(np.array([0.0]))
            elif covariance_type == "diag":
                out.append(np.array([lam[i]]))
            else:
                out.append(np.array([lam[0]]))
    out.append(z[nW + nc:])
    return np.concatenate(out)


def restrict(vec, M: int, D: int, covariance_type: str) -> np.ndarray:
    """The constrained parameters of a model vector that lies on the family (the
    inverse of :func:`embed`): its W, its λ_d (diag) or λ_1 (spherical), α, β."""
    vec = np.asarray(vec, dtype=np.float64)
    nW = (M + 1) * D
    diag = []
    k = nW
    for i in range(D):
        for j in range(i + 1):
            if i == j:
                diag.append(vec[k])
            k += 1
    lam = diag if covariance_type == "diag" else diag[:1]
    return np.concatenate([vec[:nW], lam, vec[k:]])


def smf_sigma_m_step(X, theta, W, covariance_type: str) -> np.ndarray:
    """MATH.md §6 ``Σ = (1/T) Σ_t (y_t y_tᵀ - Wᵀ E[ŝ_t] y_tᵀ)`` (symmetrised), one t at a
    time, then restricted to the family: its diagonal, or ``tr/D · I``.

    Valid at the W of the same M-step (the normal equations make it the expected
    residual covariance)."""
    X = np.asarray(X, dtype=np.float64)
    T, D = X.shape
    S = np.zeros((D, D))
    for t in range(T):
        y = X[t]
        s_hat = np.append(theta[t], 1.0)
        S += np.outer(y, y) - np.outer(W.T @ s_hat, y)
    S = 0.5 * (S + S.T) / T
    if covariance_type == "diag":
        return np.diag(np.diag(S))
    if covariance_type == "spherical":
        return np.trace(S) / D * np.eye(D)
    return S
