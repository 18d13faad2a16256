import importlib.util
from pathlib import Path

import pytest


def _load_toy():
    spec = importlib.util.spec_from_file_location("tracerl_test_toy", Path(__file__).parents[1] / "models" / "toy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TOY = _load_toy()


@pytest.fixture(scope="session")
def toy():
    return TOY


@pytest.fixture(scope="session")
def tokenizer():
    return TOY.make_tokenizer()


@pytest.fixture(scope="session")
def model(tokenizer):
    return TOY.make_model(tokenizer)
