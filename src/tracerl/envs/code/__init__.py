"""The built-in code-repair domain: SWE-bench-shaped tasks on generated Python packages (stands in
for SWE-bench offline): repository, issue, hidden FAIL_TO_PASS / PASS_TO_PASS tests run by pytest in
a sandbox, SWE-agent-shaped tools, gold patches, SWE-RL's reward as an option."""

from tracerl.envs.code.env import CodeEnv
from tracerl.envs.code.tasks import SPLITS, TEST_SEEDS, TRAIN_SEEDS, CodeTask, generate_task, task_seeds

__all__ = ["SPLITS", "TEST_SEEDS", "TRAIN_SEEDS", "CodeEnv", "CodeTask", "generate_task", "task_seeds"]
