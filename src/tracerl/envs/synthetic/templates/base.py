"""The shared machinery of the capability templates: a seeded task over records of the target's
entity, the target's own tool schemas in front of a small in-memory database, a scripted user,
hints, and the oracle.

A template subclass says how to build a task from a seed (`generate`) and how to score the
episode from the calls it made (`score`). Everything else — tools, prompts, episode mechanics
(from `ToolEnv`) — is here, so every template is interface-faithful the same way: its tools are
the target's schemas verbatim, tool results are JSON objects in the shape of the target's own
results where the target has observed ones (`Target.result_examples`, `shaped`), errors are
"Error: …" texts.
"""

from __future__ import annotations

import copy
import json
import random
from abc import abstractmethod
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tracerl.core.messages import Action, Message, canonical_json
from tracerl.core.tools import ToolSchema
from tracerl.envs.base import ToolEnv
from tracerl.envs.prompts import NEXT_REQUEST_RULE, with_hint
from tracerl.envs.scripted_user import Question, ScriptedUser, request_questions
from tracerl.envs.synthetic.target import (
    Target,
    ToolFamily,
    fill_request,
    request_parameters,
    tool_families,
)
from tracerl.envs.synthetic.values import id_value, sample_arguments
from tracerl.envs.tools import Toolbox, ToolError, add_schema_tool

# What a record's status becomes after a write tool ran, by the tool's leading verb.
_VERB_STATUS = {
    "cancel": "cancelled", "update": "updated", "modify": "modified", "return": "return requested",
    "exchange": "exchange requested", "send": "sent", "book": "booked",
}
MAX_DIFFICULTY = 4
TARGET_WORDED_SHARE = 0.5  # tasks that are the target's own requests, in templates that ask them


@dataclass
class Task:
    """One task instance: the database, the request, the policy rules and what solves it."""

    records: dict[str, dict[str, Any]]  # id -> the record the check tool returns
    requests: list[str]  # the user's requests, given one at a time ("cancel order #W1 (reason: …)")
    rules: list[str]  # policy lines for the system prompt
    hint: str  # expert guidance: how to go about it, never the calls themselves
    gold: list[Action]  # the oracle's call sequence
    kind: str  # a short label of the task's kind
    expected: dict[str, Any] = field(default_factory=dict)  # what the template's scorer needs
    user_id: str | None = None  # the user's id, given when the agent asks for it
    user_fields: dict[str, Any] = field(default_factory=dict)  # the user tool's fields besides the id and records
    questions: list[list[Question]] | None = None  # per request, the user's answers about it (ScriptedUser)


@dataclass
class TargetRequest:
    """One of the target users' requests asked on a template's record (`TemplateEnv.ask_target_request`)."""

    text: str  # the user's words, the template's values in them
    arguments: dict[str, Any]  # the write that serves it, on the template's record and user
    fields: dict[str, Any]  # the record's fields it was made on (its id and user left out)
    user: dict[str, Any]  # the user's fields it was made on
    questions: list[Question]  # the target user's answers about it (its record, the payment it names)


class TemplateEnv(ToolEnv):
    """A capability environment built on one target's tool family (see `Target`, `ToolFamily`)."""

    capability: ClassVar[str] = ""
    description: ClassVar[str] = ""
    max_turns = 12

    def __init__(self, target: Target, difficulty: int = 1, max_turns: int | None = None):
        super().__init__(max_turns=max_turns)
        self._fixed_max_turns = max_turns  # None: 10 + 3 per gold call, set per task
        if not 0 <= int(difficulty) <= MAX_DIFFICULTY:
            raise ValueError(f"difficulty must be in 0..{MAX_DIFFICULTY}, got {difficulty}")
        families = tool_families(target.tools)
        if not families:
            raise ValueError(f"target '{target.name}' has no read tool sharing an id parameter with a write tool")
        self.target = target
        self.difficulty = int(difficulty)
        self.family: ToolFamily = families[0]
        self.acts: list[ToolSchema] = self.choose_acts(self.family)
        self.name = f"{target.name}:{self.capability}"

    # --- for templates ---------------------------------------------------------------------
    def choose_acts(self, family: ToolFamily) -> list[ToolSchema]:
        """The write tools this template's tasks use (default: the simplest one)."""
        return [family.acts[0]]

    @abstractmethod
    def generate(self, rng: random.Random) -> Task:
        """The task of one seed (all randomness from `rng`)."""

    @abstractmethod
    def score(self, task: Task, calls: list[Action], attempts: list[Action]) -> tuple[float, dict[str, float]]:
        """Reward in [0, 1] and its breakdown, from the successful tool calls, in order, and every call
        that could have been a write (`attempts`: the failed ones too — a mistyped id, a bad argument, a
        mangled tool name; see `write_attempts`)."""

    # --- helpers for templates -------------------------------------------------------------
    @property
    def entity(self) -> str:
        return self.family.entity.replace("_", " ")

    @property
    def id_param(self) -> str:
        return self.family.id_param

    def id_spec(self) -> dict[str, Any]:
        return self.family.check.parameters["properties"][self.id_param]

    def user_tool(self) -> ToolSchema | None:
        """The target's read tool that takes only a user id (e.g. get_user_details), if any."""
        for t in self.target.tools:
            if t.kind == "read" and t.parameters.get("required") == ["user_id"] and t.name != self.family.check.name:
                return t
        return None

    def tool_names(self) -> list[str]:
        """The tools this env lists: every tool of the target, in its order, for the agent reads its
        prompt's tool list: with only the task's tools listed, an agent checked a record where on the
        target it did not (measured 2026-12-04; listing every tool since 3fcdd22)."""
        return [t.name for t in self.target.tools]

    def task_tools(self) -> list[str]:
        """The tools this env implements (3–5): the user tool (if any), the check tool, the acts, one
        distractor act. A call of any other listed tool is an error that changes nothing."""
        user = self.user_tool()
        names = ([user.name] if user else []) + [self.family.check.name] + [a.name for a in self.acts]
        spare = [a.name for a in self.family.acts if a.name not in names]
        return names + spare[:1]

    def new_user_id(self, rng: random.Random) -> str | None:
        user = self.user_tool()
        return id_value(user.parameters["properties"]["user_id"], "user_id", rng, self.target.value_examples) if user else None

    def request_phrase(self, act: ToolSchema, record_id: str, arguments: dict[str, Any] | None = None) -> str:
        """'cancel_pending_order' on '#W1' → 'cancel pending order #W1 (reason: "no longer needed")'."""
        words = act.name.split("_")
        entity_words = self.family.entity.split("_")
        n = len(entity_words)
        at = next((i for i in range(len(words) - n + 1) if words[i:i + n] == entity_words), None)
        if at is None:
            text = f"{' '.join(words)} for {self.entity} {record_id}"
        else:
            text = " ".join(words[:at + n] + [record_id] + words[at + n:])
        details = self.render_args(arguments or {}, self.id_param)
        return f"{text} ({details})" if details else text

    def worded_requests(self, act: ToolSchema, arguments: Collection[str]) -> list[dict[str, Any]]:
        """The target's request examples for `act` that state exactly these arguments."""
        examples = (self.target.request_examples or {}).get(act.name, [])
        return [e for e in examples if request_parameters(e["request"]) == set(arguments)]

    def worded_request(self, act: ToolSchema, arguments: dict[str, Any], rng: random.Random,
                       allowed: bool | None = None) -> tuple[str, dict[str, Any], bool] | None:
        """One of the target users' requests for `act` (drawn with `rng`; only ones its rules allowed,
        or forbade, where `allowed` says) with these arguments' values, the fields of the record it was
        made on (its id and user left out) — so that the target's rules decide it on the template's
        record as they did there: 'cancel reservation rowan because of my health' on an insured
        reservation — and whether they allowed it. None where the target has no such request."""
        worded = [e for e in self.worded_requests(act, arguments) if allowed is None or e["allowed"] == allowed]
        if not worded:
            return None
        example = rng.choice(worded)
        return fill_request(example["request"], arguments), self.record_fields(example), example["allowed"]

    def record_fields(self, example: dict[str, Any]) -> dict[str, Any]:
        """A copy of the fields of the record a target request example was made on, its id and user left out."""
        return copy.deepcopy({k: v for k, v in example["record"].items() if k not in (self.id_param, "user_id")})

    def askable_requests(self, act: ToolSchema) -> list[dict[str, Any]]:
        """The target's requests for `act` (`Target.request_examples`) a template can ask on its own
        record: they name the record and say no value but the act's arguments."""
        said = {self.id_param, *act.parameters.get("properties", {})}
        return [e for e in (self.target.request_examples or {}).get(act.name, [])
                if "write" in e and self.id_param in request_parameters(e["request"])
                and request_parameters(e["request"]) <= said]

    def ask_target_request(self, act: ToolSchema, example: dict[str, Any], rng: random.Random, record_id: str,
                           user_id: str | None) -> TargetRequest:
        """`example` (one of `askable_requests(act)`) on record `record_id` of user `user_id`: the values
        it says drawn anew (`arguments`), a value the agent computes kept — right for the record's and
        the user's fields, which come with it, so the target's rules decide and compute it here as they
        did there."""
        said = request_parameters(example["request"]) - {self.id_param}
        values = {**self.arguments(act, rng, record_id), self.id_param: record_id, "user_id": user_id}
        values = {k: v for k, v in values.items() if k in said or k in (self.id_param, "user_id")}
        arguments = {k: values[v[1:-1]] if isinstance(v, str) and v.startswith("{") else v
                     for k, v in example["write"]["arguments"].items()}
        return TargetRequest(text=fill_request(example["request"], values), arguments=arguments,
                             fields=self.record_fields(example), user=copy.deepcopy(example.get("user", {})),
                             questions=request_questions(record_id, entity=self.entity, payment=values.get("payment_id")))

    def arguments(self, act: ToolSchema, rng: random.Random, record_id: str) -> dict[str, Any]:
        """Values for every required parameter of `act` on record `record_id`, in the target's shapes."""
        return sample_arguments(act, rng, {self.id_param: record_id}, self.target.value_examples)

    @staticmethod
    def phrase(act: ToolSchema) -> str:
        """'cancel_pending_order' → 'cancel pending order'."""
        return act.name.replace("_", " ")

    @staticmethod
    def render_args(arguments: dict[str, Any], skip: str) -> str:
        """'reason: "no longer needed", payment id: "gift_card_1"' (the id parameter left out)."""
        parts = [f"{k.replace('_', ' ')}: {json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items() if k != skip]
        return ", ".join(parts)

    def is_write(self, call: Action) -> bool:
        return self.target.tool(call.name).kind == "write"

    def on_record(self, calls: list[Action], record_id: str, *, write: bool) -> list[tuple[int, Action]]:
        """(position, call) of the reads (write=False) or writes (write=True) on one record."""
        return [(i, c) for i, c in enumerate(calls)
                if c.arguments.get(self.id_param) == record_id and self.is_write(c) == write]

    def names_record(self, attempt: Action, record_id: str, record_ids: Collection[str]) -> bool:
        """Whether a write attempt was on `record_id`: it names it, or it names none of the task's
        records (`record_ids`) — a mistyped or missing id, which is then taken to mean this one."""
        named = attempt.arguments.get(self.id_param)
        return named == record_id or not (isinstance(named, str) and named in record_ids)

    @staticmethod
    def same_call(a: Action, b: Action) -> bool:
        """Same tool, and every argument of `b` (the gold call) equal in `a`."""
        return a.name == b.name and all(
            canonical_json(a.arguments.get(k)) == canonical_json(v) for k, v in b.arguments.items()
        )

    # --- ToolEnv ---------------------------------------------------------------------------
    def task(self, seed: int) -> Task:
        rng = random.Random(f"{self.capability}|{self.target.name}|{self.difficulty}|{int(seed)}")
        return self.generate(rng)

    def oracle(self, seed: int) -> list[Action]:
        return list(self.task(seed).gold)

    def hint(self, seed: int) -> str:
        return self.task(seed).hint

    def system_prompt(self, task: Task, hint: bool) -> str:
        """The target's preamble, this task's rules, the target's closing lines (+ the hint)."""
        target = self.target
        if len(target.preamble) > 1:  # the target's own procedure lines
            lines = [*target.preamble, *task.rules]
        else:
            lines = [*target.preamble] + ([""] if target.title.startswith("#") else []) + [
                f"Use the tools to help the user with their {self.entity}s. Make one tool call at a time.", *task.rules]
        lines += list(target.closing)
        if not any(NEXT_REQUEST_RULE in line for line in lines):  # the user gives its requests one at a time
            lines.append(NEXT_REQUEST_RULE)
        text = "\n".join(lines)
        return with_hint(text, task.hint) if hint else text

    def _setup(self, seed: int, options: dict[str, Any]) -> tuple[Toolbox, list[Message], dict[str, Any]]:
        task = self.task(seed)
        self._task = task
        self._records = copy.deepcopy(task.records)
        self._calls: list[Action] = []  # successful calls, in order
        self._user = ScriptedUser(task.requests, task.user_id, task.questions)
        self._turn_limit = self._fixed_max_turns or 10 + 3 * len(task.gold) + len(task.requests)
        self.max_turns = self._turn_limit
        toolbox = Toolbox()
        user = self.user_tool()
        implemented = self.task_tools()
        for name in self.tool_names():
            schema = self.target.tool(name)
            if name not in implemented:
                handler = self._unavailable_handler(name)
            elif user is not None and name == user.name:
                handler = self._user_handler()
            elif schema.kind == "read":
                handler = self._read_handler(name)
            else:
                handler = self._write_handler(name)
            add_schema_tool(toolbox, schema, handler)
        opening = [Message.system(self.system_prompt(task, bool(options.get("hint")))), Message.user(self._user.opening())]
        info = {
            "task_id": f"{self.capability}-{seed}",
            "capability": self.capability,
            "task_kind": task.kind,
            "difficulty": self.difficulty,
            "gold_actions": [a.model_dump() for a in task.gold],
        }
        return toolbox, opening, info

    @staticmethod
    def _unavailable_handler(name: str):
        def handler(**_: Any) -> dict[str, Any]:
            raise ToolError(f"{name} is not available for this request")

        return handler

    def _user_handler(self):
        def handler(**arguments: Any) -> dict[str, Any]:
            if self._task.user_id is None or arguments.get("user_id") != self._task.user_id:
                raise ToolError(f"user {arguments.get('user_id')} not found")
            user = {**self._task.user_fields, "user_id": self._task.user_id,
                    f"{self.family.entity}s": list(self._task.records)}
            return self.shaped(self.user_tool().name, user)

        return handler

    def _read_handler(self, name: str):
        def handler(**arguments: Any) -> dict[str, Any]:
            record = self._records.get(arguments.get(self.id_param))
            if record is None:
                raise ToolError(f"{self.entity} {arguments.get(self.id_param)} not found")
            self._calls.append(Action(name=name, arguments=arguments))
            return self.shaped(self.family.check.name, record)

        return handler

    def _write_handler(self, name: str):
        verb = name.split("_")[0]

        def handler(**arguments: Any) -> dict[str, Any]:
            record = self._records.get(arguments.get(self.id_param))
            if record is None:
                raise ToolError(f"{self.entity} {arguments.get(self.id_param)} not found")
            self._calls.append(Action(name=name, arguments=arguments))
            record["status"] = _VERB_STATUS.get(verb, f"{verb} done")
            answer = (self.target.result_examples or {}).get(name)
            if answer is not None:  # the fields the target's own write answered with, this record's values
                return self.shaped(name, {k: record[k] for k in answer if k in record})
            return self.shaped(self.family.check.name, record)

        return handler

    def shaped(self, tool_name: str, record: dict[str, Any]) -> dict[str, Any]:
        """`record` in the shape of what the target's `tool_name` returned (`Target.result_examples`):
        the observed result's fields, with the template's own fields over them and the task's user as
        the record's user. A small agent trained on the target reads its usual fields; the template's
        rules only ever look at its own."""
        example = (self.target.result_examples or {}).get(tool_name, {})
        user = {"user_id": self._task.user_id} if "user_id" in example and self._task.user_id else {}
        return copy.deepcopy({**example, **user, **record})

    def _user_reply(self, text: str) -> tuple[str | None, bool]:
        return self._user.reply(text)

    def _score(self) -> tuple[float, dict[str, float]]:
        reward, breakdown = self.score(self._task, self._calls, self.write_attempts())
        return min(1.0, max(0.0, reward)), breakdown

    def write_attempts(self) -> list[Action]:
        """Every call in this episode that could have been a write, in order, whether it succeeded or
        not: every call but those of the target's read tools. A call of a name that is no tool at all
        ("cancel", "cancel reservation: ") counts: only its typo kept the database unchanged, and
        GRPO finds that way out of a forbidden write (measured: a precondition adapter passed 25 of the
        target's 35 forbidden cancellations so, none by refusing in words)."""
        reads = {t.name for t in self.target.tools if t.kind == "read"}
        return [Action(name=call.function.name, arguments=call.parsed_arguments() or {})
                for m in self.messages if m.role == "assistant" for call in m.tool_calls or []
                if call.function.name not in reads]

    # --- record helpers ----------------------------------------------------------------------
    def new_ids(self, rng: random.Random, n: int) -> list[str]:
        ids: list[str] = []
        while len(ids) < n:
            value = id_value(self.id_spec(), self.id_param, rng, self.target.value_examples)
            if value not in ids:
                ids.append(value)
        return ids

    def make_record(self, record_id: str, rng: random.Random, own_fields: bool = True, **fields: Any) -> dict[str, Any]:
        """A record as the check tool returns it: id, status, amount, created_at, flagged, with `fields`
        over them. `own_fields=False` leaves out amount, created_at and flagged where the target has an
        observed record (`shaped` fills in its fields): for a template whose rules do not read them, a
        field the target's records never have only changes what the agent reads."""
        record = {self.id_param: record_id, "status": "active"}
        if own_fields or self.family.check.name not in (self.target.result_examples or {}):
            record.update({"amount": rng.randint(1, 18) * 50, "created_at": f"2024-05-{rng.randint(1, 14):02d}",
                           "flagged": False})
        record.update(fields)
        return record
