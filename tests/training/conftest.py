import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # training_helpers (pytest runs with --import-mode=importlib)

from training_helpers import tiny_qwen3  # noqa: E402


@pytest.fixture
def tiny_model():
    return tiny_qwen3().eval()
