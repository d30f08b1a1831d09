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

matplotlib.use("agg")  # tests draw figures without a screen
