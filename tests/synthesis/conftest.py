"""Fixtures: the targets (built-in airline, τ²-bench retail and airline tools.json)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # synthesis_cases (pytest runs with --import-mode=importlib)

from tracerl.synthesis.target import Target, load_target


@pytest.fixture(scope="session")
def retail(request) -> Target:
    shared = Path(__file__).resolve().parents[2].parent / "shared"
    return load_target(str(shared / "tau2" / "retail" / "tools.json"))


@pytest.fixture(scope="session")
def tau2_airline() -> Target:
    shared = Path(__file__).resolve().parents[2].parent / "shared"
    return load_target(str(shared / "tau2" / "airline" / "tools.json"))


@pytest.fixture(scope="session")
def airline() -> Target:
    return load_target("airline")
