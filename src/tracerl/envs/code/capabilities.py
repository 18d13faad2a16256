"""The code domain's capability environments: TRACE step 2's templates for code agents.

Each keeps the target's interface exactly — the same tools (`str_replace_editor`, `search_dir`,
`bash`, `submit`: the same schemas), system prompt, issue format and grading — and draws its own
tasks (`TaskShape`, seeded apart from the target's) so that success rests on one capability. The
difficulty (0–4) sets how much there is to get wrong. Each has a hint (expert guidance: how to go
about it, never the edit itself), an oracle (the gold calls) and a reward computed by code:

- `fault_localization`: one bug, always a decoy module holding the same helpers (unused), more
  modules and helpers as the difficulty grows; reward 1 iff resolved (an edit in the decoy fixes
  nothing);
- `test_verification`: one bug; from difficulty 2 the issue suggests the slip as the fix (a wrong
  fix the repository's tests catch); reward 1 iff resolved and the tests ran after the last edit,
  0.5 resolved without that run, 0 otherwise;
- `multi_bug_completion`: two bugs behind two symptoms; reward the share of FAIL_TO_PASS tests that
  pass when every PASS_TO_PASS test does (0.5 for one of two), else 0.

`CAPABILITY_ENVS` maps each capability name to its class; the environment registry offers them
to synthesis (`tracerl.envs.registry.capability_templates`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from tracerl.core.messages import Action, Message
from tracerl.envs.code.env import CodeEnv
from tracerl.envs.code.grading import grade
from tracerl.envs.code.tasks import REPO_TESTS, TEST_COMMAND, TaskShape

MAX_DIFFICULTY = 4
EDIT_COMMANDS = ("str_replace", "insert", "create")


def tested_after_last_edit(messages: list[Message]) -> bool:
    """Whether a shell command running pytest came after the episode's last edit that applied."""
    answers = {m.tool_call_id: m.content or "" for m in messages if m.role == "tool"}
    last_edit, last_test = -1, -1
    calls = [c for m in messages if m.role == "assistant" for c in m.tool_calls or []]
    for i, call in enumerate(calls):
        args = call.parsed_arguments() or {}
        if call.name == "str_replace_editor" and args.get("command") in EDIT_COMMANDS \
                and not answers.get(call.id, "Error:").startswith("Error:"):
            last_edit = i
        elif call.name == "bash" and "pytest" in str(args.get("command", "")):
            last_test = i
    return last_edit >= 0 and last_test > last_edit


class CodeCapabilityEnv(CodeEnv):
    """A capability environment on the code target: `CodeEnv`'s interface, its own tasks (the task family
    `shape_for(difficulty)`, fixed when it is made) and reward."""

    capability: ClassVar[str] = ""
    description: ClassVar[str] = ""

    def __init__(self, target: Any = None, difficulty: int = 1, max_turns: int | None = None):
        if not 0 <= int(difficulty) <= MAX_DIFFICULTY:
            raise ValueError(f"difficulty must be in 0..{MAX_DIFFICULTY}, got {difficulty}")
        super().__init__(max_turns=max_turns, shape=self.shape_for(int(difficulty)))
        self.target = target
        self.difficulty = int(difficulty)
        self.name = f"code:{self.capability}"

    @classmethod
    def shape_for(cls, difficulty: int) -> TaskShape:
        """The tasks of this capability at `difficulty`."""
        raise NotImplementedError

    def _setup(self, seed, options):
        toolbox, opening, info = super()._setup(seed, options)
        info.update({"task_id": f"{self.capability}-{seed}", "capability": self.capability, "difficulty": self.difficulty,
                     "gold_actions": [a.model_dump() for a in self.oracle(seed)]})
        return toolbox, opening, info

    def oracle(self, seed: int) -> list[Action]:
        """The gold edits, a test run and `submit`."""
        task = self.make_task(seed)
        edits = [Action(name="str_replace_editor", arguments={"command": "str_replace", "path": b.path,
                                                               "old_str": b.line.strip(), "new_str": b.fixed.strip()})
                 for b in task.bugs]
        return [*edits, Action(name="bash", arguments={"command": TEST_COMMAND}), Action(name="submit", arguments={})]

    def _grade(self):
        assert self.task is not None
        return grade(self._tools.files, {REPO_TESTS: self.task.files[REPO_TESTS]}, self.task.hidden_tests,
                     self.task.fail_to_pass, self.task.pass_to_pass, self._tools.limits)


class FaultLocalizationEnv(CodeCapabilityEnv):
    capability = "fault_localization"
    description = ("Find the helper the public function calls, in the module the package imports it from, past a "
                   "decoy module holding copies of the same helpers; fix it there.")
    guidance = ("The package runs only what api.py imports: look at its import line for the helper, and fix the helper in "
            "that module. A module the package never imports is a decoy: an edit there changes nothing.")

    @classmethod
    def shape_for(cls, difficulty: int) -> TaskShape:
        return TaskShape(salt=f"{cls.capability}-{difficulty}", kind="single", decoy=True,
                         modules=1 if difficulty < 2 else 2, clean=min(3, 1 + difficulty))

    def _score(self) -> tuple[float, dict[str, float]]:
        g = self._grade()
        return (1.0 if g.resolved else 0.0), g.breakdown()


class TestVerificationEnv(CodeCapabilityEnv):
    __test__ = False  # not a pytest test class
    capability = "test_verification"
    description = "Run the repository's tests after changing the code and before submitting; redo a fix they reject."
    guidance = ("After every change, run the repository's tests with the shell and read the result; submit only when they "
            "pass. A fix the issue suggests can be wrong: the tests tell.")

    @classmethod
    def shape_for(cls, difficulty: int) -> TaskShape:
        return TaskShape(salt=f"{cls.capability}-{difficulty}", kind="single", decoy=difficulty >= 3,
                         clean=min(3, 1 + difficulty // 2), suggest_slip=difficulty >= 2)

    def _score(self) -> tuple[float, dict[str, float]]:
        g = self._grade()
        verified = tested_after_last_edit(self.messages)
        if not g.resolved:
            return 0.0, {**g.breakdown(), "VERIFIED": float(verified)}
        return (1.0 if verified else 0.5), {**g.breakdown(), "VERIFIED": float(verified)}


class MultiBugCompletionEnv(CodeCapabilityEnv):
    capability = "multi_bug_completion"
    description = "Fix every fault the issue reports — two symptoms, two helpers — not only the first."
    guidance = ("The issue reports more than one wrong result. Find and fix the cause of each one, and run the tests, "
            "before you submit.")

    @classmethod
    def shape_for(cls, difficulty: int) -> TaskShape:
        return TaskShape(salt=f"{cls.capability}-{difficulty}", kind="multi", decoy=difficulty >= 2,
                         modules=1 if difficulty < 3 else 2, clean=min(3, 1 + difficulty // 2))

    def _score(self) -> tuple[float, dict[str, float]]:
        g = self._grade()
        share = g.breakdown()["FAIL_TO_PASS"] if all(g.pass_to_pass.values()) else 0.0
        return share, g.breakdown()


CAPABILITY_ENVS: dict[str, type[CodeCapabilityEnv]] = {
    cls.capability: cls for cls in (FaultLocalizationEnv, TestVerificationEnv, MultiBugCompletionEnv)
}
