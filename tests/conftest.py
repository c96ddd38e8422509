"""Shared test configuration: Hypothesis draws the same examples on every run.

The profile ``"streamfhmm"`` is loaded for the whole suite before any test module is
imported, so the ``@settings(...)`` of each property test inherit from it and override
only what they name (``max_examples``, ``deadline``):

* ``derandomize=True``: examples come from a fixed seed derived from each test, so a CI
  run and a local run draw the same ones, and a failure reproduces by re-running;
* ``print_blob=True``: a failure also prints the ``@reproduce_failure`` blob;
* ``deadline=None``: on a shared 2-core machine, and with Numba compiling on first call,
  a per-example time limit only produces flaky failures (speed lives in bench/).

A random exploration run can still be asked for with
``HYPOTHESIS_PROFILE=explore pytest ...`` (random draws, the example database on).
"""
import os

import pytest
from hypothesis import settings

settings.register_profile("streamfhmm", derandomize=True, print_blob=True, deadline=None)
settings.register_profile("explore", derandomize=False, print_blob=True, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "streamfhmm"))


@pytest.fixture
def tqdm_calls(monkeypatch):
    """``record(module)``: replace ``module.tqdm`` by a wrapper that records the keyword
    arguments of every bar built (and builds it), and return that list of records."""
    def record(module):
        built = []
        original = module.tqdm

        def recording_tqdm(*args, **kwargs):
            built.append(kwargs)
            return original(*args, **kwargs)
        monkeypatch.setattr(module, "tqdm", recording_tqdm)
        return built
    return record
