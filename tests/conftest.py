"""Shared test fixtures."""

from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

TAU2_DATA = Path(__file__).resolve().parent / "data" / "tau2"  # τ²-bench data files, see its PROVENANCE.md


@pytest.fixture
def tau2_data() -> Path:
    return TAU2_DATA


def _generated_code_runs_here() -> None:
    """Where the kernel cannot confine generated environment code (no Landlock or seccomp), the tests that
    play generated environments run it unconfined, as a user would with the opt-in; the tests of the
    confinement itself skip there (tests/synthesis/test_containment.py)."""
    import os

    from tracerl.core.confine import REQUIRED
    from tracerl.envs.synthetic.sandbox import ALLOW_UNCONFINED, kernel_confinement

    if not set(REQUIRED) <= set(kernel_confinement()):
        os.environ.setdefault(ALLOW_UNCONFINED, "1")


_generated_code_runs_here()
