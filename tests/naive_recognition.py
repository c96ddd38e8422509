"""Slow, obviously-correct references for the recognition networks (MATH.md §3).

Written for clarity with loops over positions, window samples, units and heads. Nothing
here imports the module it checks: the flat weight layout and the head mapping are
re-implemented from their documentation.
"""
from __future__ import annotations

import math

import numpy as np

EPS_THETA = 1e-6
EPS_RHO = 1e-6


def n_groups_of(n_chains: int, share: str) -> int:
    return 1 if share == "all" else n_chains


def offset_of(window: int, mode: str) -> int:
    """Row t - offset is the window's first sample."""
    h = (window - 1) // 2
    return h if mode == "centred" else window - 1


def unpack(weights, n_chains, n_features, window, n_hidden, share):
    """Split the flat vector into U (G, Hg, K), c (G, Hg), V (G, P, Hg), e (G, P),
    blocks in that order, each in C order."""
    G = n_groups_of(n_chains, share)
    P = 2 * n_chains // G
    K = window * n_features
    Hg = n_hidden
    sizes = [("U", (G, Hg, K)), ("c", (G, Hg)), ("V", (G, P, Hg)), ("e", (G, P))]
    out = {}
    pos = 0
    for name, shape in sizes:
        size = int(np.prod(shape))
        out[name] = np.array(weights[pos:pos + size]).reshape(shape)
        pos += size
    assert pos == len(weights), "weight vector has the wrong length"
    return out["U"], out["c"], out["V"], out["e"]


def n_weights(n_chains, n_features, window, n_hidden, share):
    G = n_groups_of(n_chains, share)
    P = 2 * n_chains // G
    K = window * n_features
    return G * n_hidden * K + G * n_hidden + G * P * n_hidden + G * P


def raw_window(Y, t, seq_start, seq_end, window, mode):
    """The raw samples of the window at t, edge-padded: shape (window, D)."""
    off = offset_of(window, mode)
    rows = []
    for k in range(window):
        r = t - off + k
        r = min(max(r, seq_start), seq_end - 1)
        rows.append(Y[r])
    return np.array(rows)


def standardise(raw, mean, scale):
    """(window, D) raw samples to the K-vector input; missing values become 0."""
    window, D = raw.shape
    x = np.zeros(window * D)
    for k in range(window):
        for d in range(D):
            v = raw[k, d]
            x[k * D + d] = 0.0 if math.isnan(v) else (v - mean[d]) / scale[d]
    return x


def sigmoid(a):
    return 1.0 / (1.0 + math.exp(-a)) if a >= 0 else math.exp(a) / (1.0 + math.exp(a))


def net_output(x, U, c, V, e):
    """θ (M,), ρ (M,) for one standardised window x (K,)."""
    G, Hg, K = U.shape
    P = V.shape[1]
    M = G * P // 2
    theta = np.full(M, np.nan)
    rho = np.full(M, np.nan)
    for g in range(G):
        z = np.zeros(Hg)
        for u in range(Hg):
            s = c[g, u]
            for k in range(K):
                s += U[g, u, k] * x[k]
            z[u] = math.tanh(s)
        for p in range(P):
            pre = e[g, p]
            for u in range(Hg):
                pre += V[g, p, u] * z[u]
            column = g * P + p
            chain = column // 2
            if column % 2 == 0:
                theta[chain] = EPS_THETA + (1 - 2 * EPS_THETA) * sigmoid(pre)
            else:
                rho[chain] = (1 - EPS_RHO) * math.tanh(pre)
    return theta, rho


def forward(Y, lengths, weights, n_chains, window, n_hidden, share, mode, mean, scale):
    """θ, ρ (T, M) at every position of the concatenated sequences."""
    T, D = Y.shape
    U, c, V, e = unpack(weights, n_chains, D, window, n_hidden, share)
    theta = np.zeros((T, n_chains))
    rho = np.zeros((T, n_chains))
    start = 0
    for length in lengths:
        end = start + length
        for t in range(start, end):
            raw = raw_window(Y, t, start, end, window, mode)
            theta[t], rho[t] = net_output(standardise(raw, mean, scale), U, c, V, e)
        start = end
    return theta, rho
