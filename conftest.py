"""Loaded by every pytest run in this repository, including nbval on weeks/ and solutions/."""

import os
import tempfile

# Tests never touch the network: models fall back to random weights at once.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("INFER_PROFILE", "cpu")
# Notebooks and tests write figures and results here, never over the committed ones.
os.environ["INFER_FIGURES_DIR"] = tempfile.mkdtemp(prefix="infer-test-figures-")
os.environ["INFER_RESULTS_DIR"] = tempfile.mkdtemp(prefix="infer-test-results-")

import matplotlib  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

matplotlib.use("agg")  # tests draw figures without a screen

# Property-based tests (tests/test_engine_rules.py): by default a bounded run whose examples are the
# same every time; `--hypothesis-profile=long` draws 1,000 new ones. Each example runs a model, so no
# per-example deadline; a failure prints its shrunk example and a blob that reproduces it. Registered
# here, in the conftest pytest loads first, so that the command-line flag can find them.
PROPERTY_SETTINGS = dict(
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile("default", max_examples=100, derandomize=True, database=None, **PROPERTY_SETTINGS)
settings.register_profile("long", max_examples=1000, **PROPERTY_SETTINGS)
settings.load_profile("default")
