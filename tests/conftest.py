"""Shared test fixtures."""

from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

TAU2_DATA = Path(__file__).resolve().parent / "data" / "tau2"  # τ²-bench data files, see its PROVENANCE.md


@pytest.fixture
def tau2_data() -> Path:
    return TAU2_DATA
