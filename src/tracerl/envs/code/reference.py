"""Reference policies of the code domain that need no model: `oracle` and `flawed`.

Both play a code agent's procedure, one tool call per turn: for each bug of the issue, search for
the public function it names, view `api.py` (which helper it calls, and from which module the
import takes it), search for the helper's definition (the decoy module defines one too), view the
module the import names, replace the buggy line; then run the tests and submit.

`flawed` plants four code-agent failures, each drawn once per episode with its own probability,
seeded by (policy seed, task seed):

- `p1` wrong_location (fault localization): edits the helper's copy in the decoy module, which the
  package never runs — planted where the task has a decoy;
- `p2` no_verify (verification by tests): its first fix is the slip (a wrong fix the repository's
  tests catch) and it submits without running the tests — always planted;
- `p3` one_bug (multi-bug completion): fixes the first of two bugs only, then tests and submits —
  planted on `multi` tasks;
- `p4` malformed_edit (tool precision): its `str_replace` gives `old_str` with the wrong
  indentation, the edit fails, and it goes on to test and submit unchanged — always planted.

Every planted fault fails the episode. The policy writes `session.info["faults"] = {"drawn": [...],
"planted": [...]}` — ground truth for checking capability selection, never read by labellers.
"""

from __future__ import annotations

import random
from typing import Any

from tracerl.core.messages import Action, Message, ToolCall
from tracerl.core.policy import Session
from tracerl.envs.code.tasks import TEST_COMMAND, Bug, CodeTask, TaskShape, generate_task

FAULTS = ("wrong_location", "no_verify", "one_bug", "malformed_edit")  # p1, p2, p3, p4
DEFAULT_FLAWED_RATES = (0.25, 0.25, 0.25, 0.25)


def _edit(path: str, old: str, new: str) -> Action:
    return Action(name="str_replace_editor", arguments={"command": "str_replace", "path": path, "old_str": old,
                                                        "new_str": new})


def _view(path: str) -> Action:
    return Action(name="str_replace_editor", arguments={"command": "view", "path": path})


def _search(term: str) -> Action:
    return Action(name="search_dir", arguments={"search_term": term})


class ScriptedCodePolicy:
    """The oracle (`rates` all 0) or a flawed oracle; `rates` = (p1, p2, p3, p4). It plays the tasks of
    the task family `shape` (the environment's), regenerating each from the episode's seed."""

    def __init__(self, rates: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0), seed: int = 0,
                 shape: TaskShape = TaskShape()):
        if len(rates) != len(FAULTS) or not all(0.0 <= p <= 1.0 for p in rates):
            raise ValueError(f"rates must be {len(FAULTS)} probabilities in [0, 1], got {rates}")
        self.rates = tuple(float(p) for p in rates)
        self.seed = int(seed)
        self.shape = shape
        self.name = "oracle" if not any(self.rates) else "flawed:" + ",".join(f"{p:g}" for p in self.rates)

    def act(self, sessions: list[Session]) -> list[Message]:
        return [self._next(s) for s in sessions]

    def _next(self, session: Session) -> Message:
        if session.state is None:
            task = generate_task(session.seed, self.shape) if session.seed is not None else None
            if task is None or task.instance_id != session.info.get("instance_id"):
                raise TypeError("the scripted code policies play the code environment's tasks only (of their shape)")
            actions, drawn, planted = self.plan(task)
            session.state = {"plan": actions, "next": 0}
            if any(self.rates):
                session.info["faults"] = {"drawn": drawn, "planted": planted}
        plan, index = session.state["plan"], session.state["next"]
        session.state["next"] = index + 1
        action = plan[min(index, len(plan) - 1)]
        return Message.assistant(tool_calls=[ToolCall.make(action.name, action.arguments, f"call_{index + 1}")])

    def plan(self, task: CodeTask) -> tuple[list[Action], list[str], list[str]]:
        """The whole episode's tool calls, the faults drawn and those planted."""
        rng = random.Random(f"tracerl-code-flawed-{self.seed}-{task.seed}")
        drawn = [name for name, p in zip(FAULTS, self.rates, strict=True) if rng.random() < p]
        planted = []
        bugs = list(task.bugs)
        if "one_bug" in drawn and len(bugs) > 1:
            bugs = bugs[:1]
            planted.append("one_bug")
        wrong_place = "wrong_location" in drawn and task.decoy is not None
        if wrong_place:
            planted.append("wrong_location")
        slip = "no_verify" in drawn
        if slip:
            planted.append("no_verify")
        malformed = "malformed_edit" in drawn
        if malformed:
            planted.append("malformed_edit")
        actions: list[Action] = []
        for i, bug in enumerate(bugs):
            actions += self.locate(task, bug, decoy=wrong_place and i == 0)
            path = task.decoy if wrong_place and i == 0 else bug.path
            line = bug.slipped if slip and i == 0 else bug.fixed
            old = bug.line.strip()
            if malformed and i == 0:
                old = "  " + bug.line.lstrip("\n")  # two spaces more indentation than the file has
            actions.append(_edit(str(path), old, line.strip()))
        if not slip:
            actions.append(Action(name="bash", arguments={"command": TEST_COMMAND}))
        actions.append(Action(name="submit", arguments={}))
        return actions, drawn, planted

    @staticmethod
    def locate(task: CodeTask, bug: Bug, decoy: bool = False) -> list[Action]:
        """Search for the public function, view api.py, search for the helper's definition, view its
        module (the decoy instead with `decoy`)."""
        return [_search(bug.public), _view(f"{task.package}/api.py"), _search(f"def {bug.helper}("),
                _view(str(task.decoy) if decoy else bug.path)]


def scripted_code_policy_from_spec(spec: str, seed: int = 0, shape: TaskShape = TaskShape(),
                                   **options: Any) -> ScriptedCodePolicy:
    """'oracle' or 'flawed' / 'flawed:p1[,p2[,p3[,p4]]]' (missing rates are 0; bare 'flawed' = 0.25 each),
    on the tasks of `shape`. The code domain's policies take no other option: one set to anything but
    its default (another domain's `rule_check`, say) is a ValueError."""
    given = sorted(k for k, v in options.items() if v)
    if given:
        raise ValueError(f"the code domain's reference policies take no option {', '.join(given)}")
    name, _, args = spec.partition(":")
    if name == "oracle":
        if args:
            raise ValueError("'oracle' takes no parameters")
        return ScriptedCodePolicy(seed=seed, shape=shape)
    if name != "flawed":
        raise ValueError(f"not a scripted policy: '{spec}'")
    if not args:
        return ScriptedCodePolicy(DEFAULT_FLAWED_RATES, seed=seed, shape=shape)
    parts = args.split(",")
    if len(parts) > len(FAULTS):
        raise ValueError(f"'flawed' takes at most {len(FAULTS)} rates (p1..p4), got {len(parts)}")
    try:
        rates = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"the code domain's 'flawed' rates must be numbers (no scopes), got '{args}'") from None
    for i, p in enumerate(rates, start=1):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"'flawed' rate p{i} = {p:g} is outside [0, 1]")
    rates += [0.0] * (len(FAULTS) - len(rates))
    return ScriptedCodePolicy((rates[0], rates[1], rates[2], rates[3]), seed=seed, shape=shape)
