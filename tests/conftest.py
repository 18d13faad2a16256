"""Shared test fixtures."""

from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"τ²-bench data not found at {SHARED} (shared/ must sit beside the checkout)")
    return SHARED
