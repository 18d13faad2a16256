"""`CodeEnv`: the built-in SWE-bench-shaped code-repair domain (offline, deterministic).

The agent gets the issue (`CodeTask.problem_statement`) and a copy of the repository behind the
tools of `tracerl.envs.code.tools`; `submit` ends the episode. A text without a tool call gets the
answer headless SWE agents get (continue with the tools, submit when done).

Reward (`reward=`):
- `"tests"` (default, SWE-bench's): 1 iff the task is resolved — every FAIL_TO_PASS and
  PASS_TO_PASS test passes on the submitted repository (`tracerl.envs.code.grading`); the
  breakdown gives the share of each that passes;
- `"swe_rl"` (SWE-RL's): the similarity of the submitted diff to the gold patch, in [0, 1]
  (`tracerl.envs.code.swe_rl.patch_similarity`; a diff is always well-formed here, so its −1 never
  occurs); no test runs.

A trajectory's info keeps the task's SWE-bench facts (`CodeTask.info`) and, once it ends,
`model_patch`, the diff of the repository from the task's. Pass iff reward == 1.
"""

from __future__ import annotations

from typing import Any, Literal

from tracerl.core.messages import Action, Message
from tracerl.core.tools import ToolSchema
from tracerl.envs.base import StepResult, ToolEnv
from tracerl.envs.code.grading import Grade, grade
from tracerl.envs.code.reference import ScriptedCodePolicy, scripted_code_policy_from_spec
from tracerl.envs.code.sandbox import ShellLimits
from tracerl.envs.code.swe_rl import patch_similarity
from tracerl.envs.code.tasks import (
    REPO_TESTS,
    SPLITS,
    TEST_COMMAND,
    CodeTask,
    TaskShape,
    generate_task,
    task_seeds,
    unified_diff,
)
from tracerl.envs.code.tools import CodeTools
from tracerl.envs.prompts import with_hint
from tracerl.envs.tools import Toolbox

RewardKind = Literal["tests", "swe_rl"]
SYSTEM = f"""You are a software engineer. A user reported an issue in the Python repository you are given.
Fix it with the tools: str_replace_editor views and edits files, search_dir searches the files, bash runs commands in the repository (the tests: {TEST_COMMAND}). Make one tool call at a time.
Change only the code that causes the issue, never the tests. When the issue is fixed, call submit."""
HINT = ("Search for the function the issue calls and view the module that defines it; follow the helper it calls to "
        "the module that defines that helper (the import says which), fix the line there, run the tests, then submit.")
CONTINUE = "Please continue working on the task with the tools. When the issue is fixed, call submit."


def issue_message(task: CodeTask) -> str:
    return f"<issue>\n{task.problem_statement}\n</issue>\nThe repository is {task.package}. Fix the issue."


class CodeEnv(ToolEnv):
    """The code domain. `split` ("train" / "test" / None) restricts the seeds reset accepts; `shape`
    fixes parts of every task (`TaskShape`: a capability environment's own task family), so that the
    seed alone gives the task (`make_task`)."""

    name = "code"
    max_turns = 20
    guidance = HINT  # the expert guidance a hinted reset puts in the system prompt (`hint`)

    def __init__(self, split: str | None = None, max_turns: int | None = None, reward: RewardKind = "tests",
                 limits: ShellLimits | None = None, shape: TaskShape = TaskShape()):
        super().__init__(max_turns=max_turns)
        if split is not None and split not in SPLITS:
            raise ValueError(f"unknown split '{split}' (expected one of {', '.join(SPLITS)})")
        if reward not in ("tests", "swe_rl"):
            raise ValueError(f"unknown reward '{reward}' (expected 'tests' or 'swe_rl')")
        self.split = split
        self.shape = shape
        self.reward_kind = reward
        self.task: CodeTask | None = None
        self._tools = CodeTools(limits or ShellLimits())
        self.last_grade: Grade | None = None

    @property
    def tools(self) -> list[ToolSchema]:
        return self._tools.schemas

    def task_seeds(self, n: int, offset: int = 0) -> list[int]:
        return task_seeds(self.split, n, offset) if self.split is not None else super().task_seeds(n, offset)

    def _setup(self, seed: int, options: dict[str, Any]) -> tuple[Toolbox, list[Message], dict[str, Any]]:
        if self.split is not None and seed not in SPLITS[self.split]:
            seeds = SPLITS[self.split]
            raise ValueError(f"seed {seed} is not in the {self.split} split [{seeds.start}, {seeds.stop})")
        self.task = self.make_task(seed)
        self.last_grade = None
        self._tools.bind(self.task.files)
        system = with_hint(SYSTEM, self.hint(seed)) if options.get("hint") else SYSTEM
        return self._tools, [Message.system(system), Message.user(issue_message(self.task))], self.task.info()

    def make_task(self, seed: int) -> CodeTask:
        """The task of `seed` in this environment's task family (`shape`)."""
        return generate_task(seed, self.shape)

    def hint(self, seed: int) -> str:
        return self.guidance

    def reference_policy(self, spec: str, seed: int = 0, **options: Any) -> ScriptedCodePolicy:
        """'oracle' or 'flawed[:p1,…]' (`tracerl.envs.code.reference`), playing this environment's tasks."""
        return scripted_code_policy_from_spec(spec, seed=seed, shape=self.shape, **options)

    def _user_reply(self, text: str) -> tuple[str | None, bool]:
        return CONTINUE, False

    def _end_after_tool(self, name: str) -> bool:
        return name == "submit" and self._tools.submitted

    def model_patch(self) -> str:
        assert self.task is not None
        return unified_diff(self.task.files, self._tools.files)

    def step(self, message: Message) -> StepResult:
        out, reward, terminated, truncated, info = super().step(message)
        if terminated or truncated:
            info["trajectory_info"] = {"model_patch": self.model_patch()}
        return out, reward, terminated, truncated, info

    def _score(self) -> tuple[float, dict[str, float]]:
        assert self.task is not None
        if self.reward_kind == "swe_rl":
            return patch_similarity(self.model_patch(), self.task.gold_patch), {}
        self.last_grade = grade(self._tools.files, {REPO_TESTS: self.task.files[REPO_TESTS]}, self.task.hidden_tests,
                                self.task.fail_to_pass, self.task.pass_to_pass, self._tools.limits)
        return (1.0 if self.last_grade.resolved else 0.0), self.last_grade.breakdown()

    def oracle(self, seed: int) -> list[Action]:
        """The gold edits (one `str_replace` per bug) and `submit`."""
        task = self.make_task(seed)
        return [*(Action(name="str_replace_editor", arguments={"command": "str_replace", "path": b.path,
                                                                "old_str": b.line.strip(), "new_str": b.fixed.strip()})
                  for b in task.bugs), Action(name="submit", arguments={})]
