"""The built-in τ²-style airline domain: database, tools, policy, tasks, scripted user, reward."""

from tracerl.envs.airline.env import AirlineEnv
from tracerl.envs.airline.policy import POLICY
from tracerl.envs.airline.tasks import (
    SPLITS,
    TEST_SEEDS,
    TRAIN_SEEDS,
    AirlineTask,
    SubTask,
    generate_task,
    split_of,
    task_seeds,
)
from tracerl.envs.airline.tools import AirlineTools

__all__ = [
    "POLICY", "SPLITS", "TEST_SEEDS", "TRAIN_SEEDS", "AirlineEnv", "AirlineTask", "AirlineTools", "SubTask",
    "generate_task", "split_of", "task_seeds",
]
