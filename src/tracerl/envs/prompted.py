"""An environment played with another system prompt: what prompt optimisation (GEPA) changes.

`SystemPromptEnv(env, prompt)` is `env` whose episodes open with `prompt` as the system message
(in place of the environment's own, or before the first message where it has none). Everything
else — tools, user, grading, its results files — is `env`'s, so the policy, any engine that plays
it, and the trajectory record exactly the prompt the agent was given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracerl.core.messages import Action, Message
from tracerl.core.policy import Policy
from tracerl.core.tools import ToolSchema
from tracerl.core.trajectory import Trajectory
from tracerl.envs.base import Env, StepResult, UserRequest


class SystemPromptEnv(Env):
    def __init__(self, env: Env, prompt: str):
        self.env = env
        self.prompt = prompt
        self.name = env.name
        self.max_turns = env.max_turns

    @property
    def tools(self) -> list[ToolSchema]:
        return self.env.tools

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        messages, info = self.env.reset(seed=seed, options=options)
        messages = list(messages)
        if messages and messages[0].role == "system":
            messages[0] = Message.system(self.prompt)
        else:
            messages.insert(0, Message.system(self.prompt))
        return messages, info

    def step(self, message: Message) -> StepResult:
        return self.env.step(message)

    def task_seeds(self, n: int, offset: int = 0) -> list[int]:
        return self.env.task_seeds(n, offset)

    def oracle(self, seed: int) -> list[Action]:
        return self.env.oracle(seed)

    def hint(self, seed: int) -> str | None:
        return self.env.hint(seed)

    def reference_policy(self, spec: str, seed: int = 0, **options: Any) -> Policy:
        return self.env.reference_policy(spec, seed=seed, **options)

    def user_requests(self, seed: int) -> list[UserRequest]:
        return self.env.user_requests(seed)

    def write_results(self, path: Path, trajectories: list[Trajectory], agent: str) -> bool:
        return self.env.write_results(path, trajectories, agent)

    def __getattr__(self, name: str) -> Any:  # the wrapped environment's own (e.g. its task_ids)
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)
