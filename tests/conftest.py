import os
import tempfile

# Tests never touch the network: models fall back to random weights at once.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("INFER_PROFILE", "cpu")
# Notebooks run by the tests save their figures here, not over the committed ones in figures/.
os.environ["INFER_FIGURES_DIR"] = tempfile.mkdtemp(prefix="infer-test-figures-")
os.environ["INFER_RESULTS_DIR"] = tempfile.mkdtemp(prefix="infer-test-results-")

import pytest  # noqa: E402

from infer.models import load_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny():
    """The cpu profile's tiny random-weight model, loaded once for the whole session."""
    return load_model("tiny", weights="random", quiet=True)
