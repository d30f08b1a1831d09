import pytest

from infer.models import load_model


@pytest.fixture(scope="session")
def tiny():
    """The cpu profile's tiny random-weight model, loaded once for the whole session."""
    return load_model("tiny", weights="random", quiet=True)
