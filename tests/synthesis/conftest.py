"""Fixtures: the targets (built-in airline, τ²-bench retail and airline tools.json)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # synthesis_cases (pytest runs with --import-mode=importlib)
sys.path.insert(0, str(Path(__file__).parents[1]))  # contract_cases

from tracerl.envs.synthetic.target import Target

from tracerl.synthesis.target import load_target

TAU2_DATA = Path(__file__).resolve().parents[1] / "data" / "tau2"


@pytest.fixture(scope="session")
def retail(request) -> Target:
    return load_target(str(TAU2_DATA / "retail" / "tools.json"))


@pytest.fixture(scope="session")
def tau2_airline() -> Target:
    return load_target(str(TAU2_DATA / "airline" / "tools.json"))


@pytest.fixture(scope="session")
def airline() -> Target:
    return load_target("airline")
