"""Recognition networks: a window of observations to every chain's θ and ρ (MATH.md §3).

``RecognitionNet`` owns one flat float64 weight vector (so optimisers and distributed
code treat the network as one array), named views into it, the input standardisation,
and the Python-level entry points. The numerical work is in
:mod:`streamfhmm.kernels.recognition`, whose module docstring fixes the window, head and
weight-layout conventions.

Windows near a sequence's ends are padded by repeating the edge sample.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ._validation import (_as_float_array, check_lengths, check_observations,
                          check_positive_int, check_random_state, check_real)
from .kernels.bvn import EPS_RHO, EPS_THETA
from .kernels import recognition as _rk

__all__ = ["RecognitionNet", "SHARE_MODES", "WINDOW_MODES", "check_net"]

#: hidden-layer sharing: one layer for all 2M heads, or one group of units per chain
SHARE_MODES = ("all", "chain")
#: "centred": x_t = y_{t-h..t+h} (smoothing, lag h); "causal": y_{t-2h..t} (filtering)
WINDOW_MODES = ("centred", "causal")

_EPS_THETA = EPS_THETA
_EPS_RHO = EPS_RHO
#: how close to its bounds ``init`` may start θ and ρ (a logit of about ±6.9)
_INIT_MARGIN = 1e-3

_ARRAY_KEYS = ("n_chains", "n_features", "window", "n_hidden", "share", "mode",
               "weights", "mean", "scale")


def _check_choice(value, name, choices):
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, "
                         f"got {value!r}")
    return value


#: the most weights a network may hold (8 TB of float64): larger sizes are mistakes
_MAX_WEIGHTS = 2 ** 40


class RecognitionNet:
    """One-hidden-layer recognition network for every chain's θ and ρ.

    Parameters
    ----------
    n_chains : int
        M, the number of binary chains.
    n_features : int
        D, the observed dimension.
    window : int
        Samples per window, odd: ``2h + 1``.
    n_hidden : int
        Hidden units per group: the whole layer for ``share="all"``, per chain for
        ``share="chain"``.
    share : {"all", "chain"}
        One hidden layer for all ``2M`` heads (G = 1 group), or one group of
        ``n_hidden`` units per chain feeding only that chain's θ and ρ heads (G = M).
    mode : {"centred", "causal"}
        Centred windows ``y_{t-h..t+h}`` (smoothing, lag h) or causal ones
        ``y_{t-2h..t}`` (filtering, lag 0).

    Attributes
    ----------
    weights : ndarray, shape (n_weights,)
        The flat weight vector; assigning to it copies into place, so the views stay valid.
    U, c, V, e : ndarray views, shapes (G, Hg, K), (G, Hg), (G, P, Hg), (G, P)
        ``z = tanh(U[g] x + c[g])`` per group; head ``p`` of group ``g`` computes
        ``V[g, p] · z_g + e[g, p]``, the pre-activation of column ``j = g*P + p``; column
        ``2m`` is chain m's θ, ``2m + 1`` its ρ (see :meth:`head`).
    mean, scale : ndarray, shape (D,)
        Input standardisation ``(y - mean) / scale``; missing values become 0.

    Notes
    -----
    MATH.md §3. New networks have zero weights and the identity scaler; call
    :meth:`init` (and :meth:`fit_scaler`) before use.

    Examples
    --------
    >>> net = RecognitionNet(2, 3, window=5, n_hidden=4).init(random_state=0)
    >>> theta, rho = net.forward(np.zeros((10, 3)))
    >>> theta.shape, rho.shape
    ((10, 2), (10, 2))
    """

    def __init__(self, n_chains, n_features, window=5, n_hidden=30, share="all",
                 mode="centred"):
        M = check_positive_int(n_chains, "n_chains")
        D = check_positive_int(n_features, "n_features")
        W = check_positive_int(window, "window")
        if W % 2 != 1:
            raise ValueError(f"window must be an odd integer >= 1 (2h + 1 samples), got {W}")
        Hg = check_positive_int(n_hidden, "n_hidden")
        self._share = _check_choice(share, "share", SHARE_MODES)
        self._mode = _check_choice(mode, "mode", WINDOW_MODES)
        self._n_chains, self._n_features, self._window, self._n_hidden = M, D, W, Hg
        G = 1 if share == "all" else M
        # (in Python's integers: sizes past the compiled layout's int64 raised OverflowError)
        n = G * Hg * (W * D + 1) + 2 * M * (Hg + 1)
        if n > _MAX_WEIGHTS:
            raise ValueError(f"the networks would hold about {n:.3g} weights (n_chains={M}, "
                             f"n_features={D}, window={W}, n_hidden={Hg}, share={share!r}); "
                             f"expected at most {_MAX_WEIGHTS:.3g}")
        self._layout = _rk.weight_layout(M, D, W, G, Hg)
        self._weights = np.zeros(int(self._layout[_rk.LAYOUT_N_WEIGHTS]), dtype=np.float64)
        self._mean = np.zeros(D, dtype=np.float64)
        self._scale = np.ones(D, dtype=np.float64)
        self._make_views()

    def _make_views(self):
        lay, w = self._layout, self._weights
        G, Hg, P, K = self.n_groups, self._n_hidden, self.n_heads, self.n_inputs
        oU, oC = int(lay[_rk.LAYOUT_OFF_U]), int(lay[_rk.LAYOUT_OFF_C])
        oV, oE = int(lay[_rk.LAYOUT_OFF_V]), int(lay[_rk.LAYOUT_OFF_E])
        self._U = w[oU:oC].reshape(G, Hg, K)
        self._c = w[oC:oV].reshape(G, Hg)
        self._V = w[oV:oE].reshape(G, P, Hg)
        self._e = w[oE:].reshape(G, P)

    # ------------------------------------------------------------------ shape
    @property
    def n_chains(self) -> int:
        return self._n_chains

    @property
    def n_features(self) -> int:
        return self._n_features

    @property
    def window(self) -> int:
        return self._window

    @property
    def n_hidden(self) -> int:
        """Hidden units per group."""
        return self._n_hidden

    @property
    def share(self) -> str:
        return self._share

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def n_groups(self) -> int:
        """G: 1 for ``share="all"``, M for ``share="chain"``."""
        return int(self._layout[_rk.LAYOUT_N_GROUPS])

    @property
    def n_heads(self) -> int:
        """P = 2M / G, heads per group."""
        return int(self._layout[_rk.LAYOUT_N_HEADS])

    @property
    def n_inputs(self) -> int:
        """K = window * D."""
        return int(self._layout[_rk.LAYOUT_N_INPUTS])

    @property
    def half_window(self) -> int:
        """h, with ``window = 2h + 1``."""
        return (self._window - 1) // 2

    @property
    def lag(self) -> int:
        """Samples after t the window needs: h (centred) or 0 (causal)."""
        return self.half_window if self._mode == "centred" else 0

    @property
    def offset(self) -> int:
        """``off`` of :func:`~streamfhmm.kernels.recognition.build_windows`: the window at
        t starts at row ``t - off`` (h centred, ``window - 1`` causal)."""
        return self.half_window if self._mode == "centred" else self._window - 1

    @property
    def layout(self) -> np.ndarray:
        """The int64 layout vector the kernels take beside :attr:`weights` (do not modify)."""
        return self._layout

    @property
    def n_weights(self) -> int:
        return self._weights.size

    @property
    def scratch_size(self) -> int:
        """Length of the scratch vector of :func:`~streamfhmm.kernels.recognition.forward_one`."""
        return _rk.scratch_size(self._layout)

    # ---------------------------------------------------------------- weights
    @property
    def weights(self) -> np.ndarray:
        return self._weights

    @weights.setter
    def weights(self, value):
        w = _as_float_array(value, "weights")
        if w.shape != self._weights.shape:
            raise ValueError(f"weights must have shape {self._weights.shape}, got {w.shape}")
        if not np.isfinite(w).all():
            raise ValueError("weights must be finite")
        self._weights[:] = w

    @property
    def U(self) -> np.ndarray:
        return self._U

    @property
    def c(self) -> np.ndarray:
        return self._c

    @property
    def V(self) -> np.ndarray:
        return self._V

    @property
    def e(self) -> np.ndarray:
        return self._e

    def head(self, chain: int, which: str) -> tuple[int, int]:
        """``(g, p)``: the group and head computing chain ``chain``'s ``"theta"`` or
        ``"rho"`` pre-activation (column ``2*chain`` or ``2*chain + 1``)."""
        if isinstance(chain, (bool, np.bool_)) or not isinstance(chain, (int, np.integer)) \
                or not 0 <= chain < self._n_chains:
            raise ValueError(f"chain must be an integer in [0, {self._n_chains}), got {chain!r}")
        _check_choice(which, "which", ("theta", "rho"))
        j = 2 * int(chain) + (which == "rho")
        return j // self.n_heads, j % self.n_heads

    @property
    def V_theta(self) -> np.ndarray:
        """View (M, Hg): row m is chain m's θ head."""
        return self._V[0, 0::2] if self.n_groups == 1 else self._V[:, 0]

    @property
    def V_rho(self) -> np.ndarray:
        """View (M, Hg): row m is chain m's ρ head."""
        return self._V[0, 1::2] if self.n_groups == 1 else self._V[:, 1]

    @property
    def e_theta(self) -> np.ndarray:
        """View (M,): chain m's θ head bias."""
        return self._e[0, 0::2] if self.n_groups == 1 else self._e[:, 0]

    @property
    def e_rho(self) -> np.ndarray:
        """View (M,): chain m's ρ head bias."""
        return self._e[0, 1::2] if self.n_groups == 1 else self._e[:, 1]

    def init(self, random_state=None, theta_init=0.5, rho_init=0.0, output_scale=0.1):
        """Small random weights; returns ``self``.

        ``U ~ N(0, 1/K)``, ``c = 0``, ``V ~ output_scale · N(0, 1/Hg)``, and head biases
        chosen so that θ ≈ ``theta_init`` and ρ ≈ ``rho_init`` at the start.

        Parameters
        ----------
        random_state : None, int or numpy Generator
        theta_init : float in [0.001, 0.999]
        rho_init : float in [-0.999, 0.999]
            (Closer to the bounds the heads' biases would start where the squashing
            functions are flat, θ and ρ stuck at their limits with a vanishing gradient.)
        output_scale : float ≥ 0
            Scale of the head weights; 0 gives exactly ``theta_init`` and ``rho_init``.
        """
        rng = check_random_state(random_state)
        theta_init = check_real(theta_init, "theta_init", _INIT_MARGIN, 1.0 - _INIT_MARGIN)
        rho_init = check_real(rho_init, "rho_init", -1.0 + _INIT_MARGIN, 1.0 - _INIT_MARGIN)
        output_scale = check_real(output_scale, "output_scale")
        K, Hg = self.n_inputs, self._n_hidden
        self._U[...] = rng.standard_normal(self._U.shape) / np.sqrt(K)
        self._c[...] = 0.0
        self._V[...] = output_scale * rng.standard_normal(self._V.shape) / np.sqrt(Hg)
        # θ = ε + (1 - 2ε) σ(e), ρ = (1 - ε_ρ) tanh(e): the biases giving theta_init, rho_init
        s = (theta_init - _EPS_THETA) / (1.0 - 2.0 * _EPS_THETA)
        self.e_theta[...] = np.log(s) - np.log1p(-s)
        self.e_rho[...] = np.arctanh(rho_init / (1.0 - _EPS_RHO))
        return self

    # ----------------------------------------------------------------- scaler
    @property
    def mean(self) -> np.ndarray:
        return self._mean

    @property
    def scale(self) -> np.ndarray:
        return self._scale

    def set_scaler(self, mean, scale):
        """Set the input standardisation; returns ``self``.

        Parameters
        ----------
        mean : array_like, shape (D,)
            Finite.
        scale : array_like, shape (D,)
            Finite and positive.
        """
        D = self._n_features
        mean = _as_float_array(mean, "mean")
        scale = _as_float_array(scale, "scale")
        if mean.shape != (D,):
            raise ValueError(f"mean must have shape ({D},), got {mean.shape}")
        if scale.shape != (D,):
            raise ValueError(f"scale must have shape ({D},), got {scale.shape}")
        if not np.isfinite(mean).all():
            raise ValueError("mean must be finite")
        if not (np.isfinite(scale).all() and (scale > 0).all()):
            raise ValueError("scale must be finite and positive")
        self._mean[:] = mean
        self._scale[:] = scale
        return self

    def fit_scaler(self, Y):
        """Set ``mean``/``scale`` to the per-feature mean and standard deviation of the
        observed values of ``Y`` (T, D) (a constant or empty feature gets scale 1);
        returns ``self``."""
        Y = check_observations(Y, "Y", n_features=self._n_features, allow_nan=True)
        observed = ~np.isnan(Y)
        count = observed.sum(axis=0)
        Y0 = np.where(observed, Y, 0.0)
        mean = Y0.sum(axis=0) / np.maximum(count, 1)
        dev = np.where(observed, Y - mean, 0.0)
        n = np.maximum(count, 1)
        with np.errstate(over="ignore", under="ignore"):   # (the far ones, redone below)
            std = np.sqrt((dev ** 2).sum(axis=0) / n)
        # deviations whose squares overflow (beyond 1e150) or underflow (below 1e-150):
        # in units of the largest one (±1e160 gave an infinite scale, ±1e-200 scale 1)
        peak = np.abs(dev).max(axis=0) if dev.shape[0] else np.zeros(dev.shape[1])
        far = (peak > 1e150) | ((peak > 0.0) & (peak < 1e-150))
        if far.any():
            unit = np.where(far, peak, 1.0)
            std = np.where(far, np.sqrt(((dev / unit) ** 2).sum(axis=0) / n) * unit, std)
        # constant: a spread below rounding of the feature's own magnitude (a floor of
        # 1e-12 in absolute units took data in units of 1e-13 for constant, and the fit
        # was no longer the rescaled one)
        big = np.abs(Y0).max(axis=0) if Y0.shape[0] else np.zeros(Y0.shape[1])
        scale = np.where(std > 1e-12 * big, std, 1.0)
        return self.set_scaler(mean, scale)

    # ---------------------------------------------------------- (de)serialise
    def __reduce__(self):
        # pickle and copy.deepcopy go through to_arrays/from_arrays: copied one by one,
        # the views (U, c, V, e, heads) no longer shared the weights' memory, and init()
        # or the weights setter then changed one and not the other
        return (RecognitionNet.from_arrays, (self.to_arrays(),))

    def copy(self) -> "RecognitionNet":
        """An independent copy (weights and scaler copied)."""
        new = RecognitionNet(self._n_chains, self._n_features, self._window, self._n_hidden,
                             self._share, self._mode)
        new._weights[:] = self._weights
        new._mean[:] = self._mean
        new._scale[:] = self._scale
        return new

    def to_arrays(self) -> dict:
        """Plain numpy arrays (no objects) describing the network, e.g. for ``np.savez``;
        :meth:`from_arrays` inverts it."""
        return {
            "n_chains": np.array(self._n_chains, dtype=np.int64),
            "n_features": np.array(self._n_features, dtype=np.int64),
            "window": np.array(self._window, dtype=np.int64),
            "n_hidden": np.array(self._n_hidden, dtype=np.int64),
            "share": np.array(self._share),
            "mode": np.array(self._mode),
            "weights": self._weights.copy(),
            "mean": self._mean.copy(),
            "scale": self._scale.copy(),
        }

    @classmethod
    def from_arrays(cls, arrays) -> "RecognitionNet":
        """Rebuild a network from :meth:`to_arrays` output (a dict or an ``NpzFile``)."""
        if not isinstance(arrays, Mapping) and not hasattr(arrays, "files"):
            raise ValueError(f"arrays must be a mapping of names to arrays, got "
                             f"{type(arrays).__name__}")
        keys = set(arrays.files) if hasattr(arrays, "files") else set(arrays.keys())
        missing = [k for k in _ARRAY_KEYS if k not in keys]
        if missing:
            raise ValueError(f"arrays is missing {', '.join(missing)}")

        def scalar(key, kind):
            a = np.asarray(arrays[key])
            if a.shape != () or a.dtype.kind not in kind:
                raise ValueError(f"arrays[{key!r}] must be a 0-d array, got {a!r}")
            return a.item()

        net = cls(scalar("n_chains", "iu"), scalar("n_features", "iu"), scalar("window", "iu"),
                  scalar("n_hidden", "iu"), scalar("share", "U"), scalar("mode", "U"))
        net.weights = arrays["weights"]
        net.set_scaler(arrays["mean"], arrays["scale"])
        return net

    # ---------------------------------------------------------------- forward
    def forward(self, Y, lengths=None, chunk_size=4096):
        """θ and ρ at every position of one or several sequences.

        Parameters
        ----------
        Y : array_like, shape (T, D)
            Raw observations; NaN marks a missing value.
        lengths : array_like of int, optional
            hmmlearn-style sequence lengths summing to T; default one sequence.
        chunk_size : int
            Windows per batch, bounding the memory to ``chunk_size * (K + G*Hg)`` floats.

        Returns
        -------
        theta, rho : ndarray, shape (T, M)
            Row t is the output for the window at t (edge-padded near sequence ends).

        Notes
        -----
        MATH.md §3.
        """
        Y = check_observations(Y, "Y", n_features=self._n_features, allow_nan=True)
        lengths = check_lengths(lengths, Y.shape[0])
        chunk_size = check_positive_int(chunk_size, "chunk_size")
        T, M = Y.shape[0], self._n_chains
        ends = np.cumsum(lengths)
        seq_id = np.repeat(np.arange(lengths.size), lengths)
        seq_start = (ends - lengths)[seq_id]
        seq_end = ends[seq_id]
        positions = np.arange(T, dtype=np.int64)
        theta = np.empty((T, M))
        rho = np.empty((T, M))
        nb = min(chunk_size, T)
        Xw = np.empty((nb, self.n_inputs))
        hidden = np.empty((nb, self.n_groups * self._n_hidden))
        for s in range(0, T, nb):
            e = min(s + nb, T)
            n = e - s
            _rk.build_windows(Y, seq_start[s:e], seq_end[s:e], positions[s:e], self._window,
                              self.offset, self._mean, self._scale, Xw[:n])
            _rk.forward_batch(Xw[:n], self._weights, self._layout, theta[s:e], rho[s:e],
                              hidden[:n])
        return theta, rho

    def forward_window(self, x):
        """θ and ρ for one raw window.

        Parameters
        ----------
        x : array_like, shape (window, D)
            Raw samples, oldest first; NaN marks a missing value.

        Returns
        -------
        theta, rho : ndarray, shape (M,)
        """
        x = _as_float_array(x, "x")
        if x.shape != (self._window, self._n_features):
            raise ValueError(f"x must have shape ({self._window}, {self._n_features}) "
                             f"(window, n_features), got {x.shape}")
        if np.isinf(x).any():
            raise ValueError("x must not contain infinities")
        theta = np.empty(self._n_chains)
        rho = np.empty(self._n_chains)
        scratch = np.empty(self.scratch_size)
        _rk.forward_one(x.reshape(-1), 0, self._weights, self._layout, self._mean, self._scale,
                        scratch, theta, rho)
        return theta, rho

    def __repr__(self):
        return (f"RecognitionNet(n_chains={self._n_chains}, n_features={self._n_features}, "
                f"window={self._window}, n_hidden={self._n_hidden}, share={self._share!r}, "
                f"mode={self._mode!r})")


def check_net(net, n_chains: int | None = None, n_features: int | None = None,
              whose: str = "") -> RecognitionNet:
    """``net`` if it is a :class:`RecognitionNet` (for ``n_chains`` chains and
    ``n_features`` features, ``whose`` they are, when given), else ValueError."""
    if not isinstance(net, RecognitionNet):
        raise ValueError(f"net must be a RecognitionNet, got {type(net).__name__}")
    if n_chains is not None and (net.n_chains, net.n_features) != (n_chains, n_features):
        raise ValueError(f"net must have {whose} {n_chains} chains and {n_features} features, "
                         f"got {net.n_chains} chains and {net.n_features} features")
    return net
