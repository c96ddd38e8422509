"""The README's Python examples run as printed: "Thirty seconds of API", then
"Streaming" on the samples the first one drew (its ``sensor_samples``)."""
import re
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks():
    if not README.is_file():
        pytest.skip(f"no README.md beside the tests ({README}): run from a source checkout")
    return re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"),
                      flags=re.S | re.M)


def test_the_readme_examples_run(tmp_path, monkeypatch):
    blocks = _python_blocks()
    assert len(blocks) == 2, "the README's Python examples changed: update this test"
    api, streaming = blocks
    assert "FHMM(n_chains=2" in api and "StreamEngine(model" in streaming
    monkeypatch.chdir(tmp_path)          # the examples write model.npz and state.npz
    ns = {}
    exec(compile(api, "README.md (Thirty seconds of API)", "exec"), ns)
    ns["sensor_samples"] = ns["X"][:300]
    exec(compile(streaming, "README.md (Streaming)", "exec"), ns)
    model, X = ns["model"], ns["X"]
    assert X.shape == (5000, 2) and ns["S"].shape == (5000, 2)
    # what the comments say the calls return
    assert model.predict_proba(X).shape == (5000, 2)
    assert model.reconstruct(X).shape == (5000, 2)
    assert model.elbo(X) <= model.score(X)
    np.testing.assert_array_equal(type(model).load("model.npz").predict_proba(X),
                                  model.predict_proba(X))
    metrics = ns["eng"].metrics()
    print(metrics)
    assert metrics["samples"] == 300
    assert (tmp_path / "state.npz").is_file()
