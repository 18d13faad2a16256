"""scripts/gpu_check.sh in its CPU form (`--device cpu --tiny`): the GPU check's every phase runs, on both
shapes, and writes its figures."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_runs_on_the_cpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    run = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--device", "cpu", "--tiny", "--out", str(out)],
                         env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["passed"] and result["device_name"] == "cpu" and result["dtype"] == "float32"
    assert set(result["shapes"]) == {"qwen3-8b", "qwen3-30b-a3b"}
    dense, moe = result["shapes"]["qwen3-8b"], result["shapes"]["qwen3-30b-a3b"]
    assert dense["build"]["target_parameters"] == [] and len(dense["build"]["target_modules"]) == 7
    assert sorted(moe["build"]["target_parameters"]) == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]
    for shape in (dense, moe):
        assert len(shape["grpo_steps"]) == 2 and all(s["loss_tokens"] == 2 * 32 for s in shape["grpo_steps"])
        assert shape["sampling"]["tokens_generated"] == 2 * 8
        assert 0 < shape["sampling"]["kv_peak_tokens"] <= shape["sampling"]["kv_cache_tokens"]
        for phase in ("build", "sampling", "compose", "composed_forward", "composed_sampling"):
            assert shape[phase]["seconds"] >= 0 and shape[phase]["peak_mib"] > 0
        assert all(shape["checks"].values()), shape["checks"]
