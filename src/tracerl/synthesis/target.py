"""The target domain a synthetic environment imitates: its tool schemas and system-prompt format.

A target is the built-in airline domain (`"airline"`), a τ²-bench domain given by its tools.json
(a `policy.md` next to it, if any, gives the prompt title), or a τ²-bench domain played live
(`target_from_live_env`: its tools, policy title and gold actions' values, no tools.json needed).
The prompt format is kept as `preamble` and `closing` lines: for the built-in domain, its own system prompt minus its
domain rules (the lines that start with a label such as "Cancel:"), which a synthetic
environment replaces with its own rules; for a tools.json, the policy's title. `tool_families`
pairs each read ("check") tool with the write ("act") tools that take the same id parameter —
e.g. get_order_details(order_id) with cancel_pending_order(order_id, reason) — which is what
every capability template is built from. `result_examples` keeps one observed JSON result per
tool (for the built-in domain, from oracle rollouts; `observed_result_examples` takes them
from any trajectories), so templates can answer in the target's record and write-result shapes;
`request_examples` keeps the target users' own wording of a request for each write tool, with
the record and user it was made on, the write that serves it and whether the target's rules
(`rules`) allowed it there, so templates can ask the target's own requests on records where its
rules decide them as they did.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracerl.core.errors import InputError
from tracerl.core.tools import ToolSchema, load_tools_json


@dataclass(frozen=True)
class Target:
    name: str  # "airline", "retail", …
    tools: tuple[ToolSchema, ...]
    title: str  # first line of the target's system prompt, e.g. "# Retail agent policy" (policy.md's title)
    source: str  # "airline" (built-in) or the tools.json path it was read from
    preamble: tuple[str, ...] = ()  # the target prompt's lines before its domain rules (title included)
    closing: tuple[str, ...] = ()  # its lines after the domain rules
    rules: tuple[str, ...] = ()  # its domain rules ("Cancel: …"), for templates that ask its own requests
    value_examples: dict[str, list[str]] | None = None  # parameter -> string values the target uses
    result_examples: dict[str, dict[str, Any]] | None = None  # tool -> one JSON object it returned
    # write tool -> [{"request": the user's words, each value said as "{parameter}",
    #                 "record": the record it was made on, as the check tool returned it,
    #                 "user": the user's record there, "allowed": whether the target's rules allowed it,
    #                 "write": the write {name, arguments} that serves it}] (see `request_examples`)
    request_examples: dict[str, list[dict[str, Any]]] | None = None

    def tool(self, name: str) -> ToolSchema:
        for t in self.tools:
            if t.name == name:
                return t
        raise KeyError(name)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Target:
        """The target in target.json's content, checked by its contract (`tracerl.contracts.TargetFile`);
        LLM-written environment modules read their target.json with it."""
        from tracerl.contracts import TargetFile

        return TargetFile.model_validate(data).target()


def load_target(spec: str) -> Target:
    """`"airline"` → the built-in airline domain; otherwise a path to a τ²-bench tools.json."""
    if spec == "airline":
        return _builtin_airline()
    path = Path(spec)
    if not path.exists():
        raise InputError("no such file (the target is 'airline' or a path to a tools.json)", path=spec)
    tools = load_tools_json(path)
    name = path.parent.name or path.stem
    title = f"# {name.capitalize()} agent policy"
    policy = path.parent / "policy.md"
    if policy.exists():
        first = policy.read_text().lstrip().splitlines()[0:1]
        if first and first[0].startswith("#"):
            title = first[0].strip()
    target = Target(name=name, tools=tuple(tools), title=title, source=str(path), preamble=(title,))
    if not tool_families(target.tools):
        raise InputError("no read tool shares an id parameter with a write tool: nothing to build on", path=spec)
    return target


def _builtin_airline() -> Target:
    try:
        from tracerl.envs.registry import make_env  # type: ignore[import-not-found]
    except ImportError:
        raise InputError("the built-in airline domain is not available in this installation") from None
    env = make_env("airline")
    messages, _ = env.reset(seed=0)
    prompt = messages[0].content or "" if messages and messages[0].role == "system" else ""
    preamble, rules, closing = split_prompt(prompt)
    title = preamble[0] if preamble else "# Airline agent policy"
    return Target(name="airline", tools=tuple(env.tools), title=title, source="airline",
                  preamble=preamble or (title,), closing=closing, rules=rules, value_examples=gold_value_examples(env),
                  result_examples=_oracle_result_examples(env), request_examples=task_request_examples(env))


def gold_value_examples(env: Any, seeds: int = 50, per_parameter: int = 20) -> dict[str, list[str]]:
    """`value_examples` of the env's gold actions (info["gold_actions"]) on its first seeds."""
    return value_examples((env.reset(seed=seed)[1].get("gold_actions", []) for seed in range(seeds)), per_parameter)


def value_examples(gold: Iterable[Iterable[dict[str, Any]]], per_parameter: int = 20) -> dict[str, list[str]]:
    """String argument values of gold actions ({name, arguments}), one task's list after another, by
    parameter name — ids and codes in the target's own shapes (e.g. user ids from its name pool):
    values with a digit, and every value of an `…_id` parameter."""
    found: dict[str, list[str]] = {}

    def add(name: str, value: Any) -> None:
        if isinstance(value, str) and (any(c.isdigit() for c in value) or name.endswith("_id")):
            bucket = found.setdefault(name, [])
            if value not in bucket and len(bucket) < per_parameter:
                bucket.append(value)
        elif isinstance(value, dict):
            for k, v in value.items():
                add(k, v)
        elif isinstance(value, list):
            for v in value:
                add(name[:-1] if name.endswith("s") else name, v)

    for actions in gold:
        for action in actions:
            for name, value in action.get("arguments", {}).items():
                add(name, value)
    return found


def target_from_live_env(env: Any, trajectories: list[Any] = ()) -> Target:
    """The target of a live environment that states its system prompt and gold actions without playing
    (a τ²-bench domain, `tracerl.envs.tau2_live`): its tool schemas, the title of its policy, id values
    from the gold actions of its tasks (`env.oracle`) and record shapes from `trajectories` it played."""
    titles = [line.strip() for line in env.system_prompt.splitlines() if line.startswith("# ")]
    title = titles[0] if titles else f"# {env.name.capitalize()} agent policy"
    gold = ([a.model_dump() for a in env.oracle(seed)] for seed in env.task_seeds(len(env.task_ids)))
    tools = tuple(env.tools)
    target = Target(name=env.name, tools=tools, title=title, source=f"tau2:{env.name}", preamble=(title,),
                    value_examples=value_examples(gold),
                    result_examples=observed_result_examples(list(trajectories), {t.name for t in tools}))
    if not tool_families(target.tools):
        raise InputError(f"tau2:{env.name}: no read tool shares an id parameter with a write tool: nothing to build on")
    return target


def observed_result_examples(trajectories: list[Any], tools: set[str]) -> dict[str, dict[str, Any]]:
    """The first JSON object each of `tools` returned in `trajectories` — the shape of the target's
    records (a reservation's cabin, flights, payment history…) and of its writes' answers, which
    template environments answer in (`TemplateEnv.shaped`)."""
    found: dict[str, dict[str, Any]] = {}
    for trajectory in trajectories:
        for message in trajectory.messages:
            if message.role != "tool" or message.name not in tools or message.name in found:
                continue
            try:
                result = json.loads(message.content or "")
            except json.JSONDecodeError:
                continue
            if isinstance(result, dict):
                found[message.name] = result
    return found


def _oracle_result_examples(env: Any, seeds: int = 20) -> dict[str, dict[str, Any]]:
    from tracerl.envs.registry import make_env, make_policy
    from tracerl.envs.runner import Episode, rollout

    trajectories = rollout(lambda: make_env("airline"), make_policy("oracle"), [Episode(seed=s) for s in range(seeds)])
    return observed_result_examples(trajectories, {t.name for t in env.tools})


def request_examples(requests: Iterable[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any], bool]],
                     per_tool: int = 40) -> dict[str, list[dict[str, Any]]]:
    """Write tool -> [{"request", "record", "user", "allowed", "write"}], from (the user's words, the
    write call {name, arguments} that served them — or would have, where the rules forbid it —, the
    record it was made on, the user's record, whether the rules allowed it).

    A request must name its record (each "…_id" string of the record but the user's, word for word)
    and each argument of the write must be said in the words word for word (a string), be the user's
    id, or be a number the agent computes from the records (a bag count, a certificate's amount).
    Every value said is replaced by "{parameter}" in the words and in the write's arguments, the
    user's id by "{user_id}"; a computed number stays as it was, right for the kept record."""
    found: dict[str, list[dict[str, Any]]] = {}
    for text, call, record, user, allowed in requests:
        if "{" in text:
            continue
        named = {k: v for k, v in record.items() if k.endswith("_id") and k != "user_id" and isinstance(v, str) and v}
        arguments = call.get("arguments", {})
        write = {}
        for name, value in {**named, **arguments}.items():
            said = 0
            if isinstance(value, str) and value:
                text, said = re.subn(rf"(?<!\w){re.escape(value)}(?!\w)", "{" + name + "}", text)
            if said:
                value = "{" + name + "}"
            elif name in named:
                break  # the request does not name its record
            elif value == record.get("user_id") and isinstance(value, str):
                value = "{user_id}"
            elif not isinstance(value, (int, float)) or isinstance(value, bool):
                break
            if name in arguments:
                write[name] = value
        else:
            bucket = found.setdefault(call["name"], [])
            example = {"request": text, "record": record, "user": user, "allowed": allowed,
                       "write": {"name": call["name"], "arguments": write}}
            if example not in bucket and len(bucket) < per_tool:
                bucket.append(example)
    return found


def request_parameters(request: str) -> set[str]:
    """The parameters a request example states: {"reservation_id"} for 'cancel reservation {reservation_id}'."""
    return set(re.findall(r"\{(\w+)\}", request))


def fill_request(request: str, arguments: dict[str, Any]) -> str:
    """A request example with these arguments' values in its "{parameter}" places."""
    for name, value in arguments.items():
        request = request.replace("{" + name + "}", str(value))
    return request


def task_request_examples(env: Any, seeds: Iterable[int] = range(1000), per_tool: int = 300) -> dict[str, list[dict[str, Any]]]:
    """The built-in domain's requests on the task `seeds`, each with the write that serves it (or would,
    ignoring the rules), the record it is about and the user's record as the read tools return them
    (the user's id and record list left out), and whether the rules allow it (see `request_examples`)."""
    from tracerl.core.messages import Message, ToolCall

    family = tool_families(tuple(env.tools))[0]

    def read(name: str, arguments: dict[str, Any]) -> dict[str, Any] | None:
        result = env.step(Message.assistant(tool_calls=[ToolCall.make(name, arguments, "read")]))[0][0].content or ""
        return json.loads(result) if result.startswith("{") else None

    found = []
    for seed in seeds:
        task = env.reset(seed=seed)[1]["_task"]
        user = read("get_user_details", {"user_id": task.user_id}) or {}
        user = {k: v for k, v in user.items() if k not in ("user_id", f"{family.entity}s")}
        for sub in task.subtasks:
            writes = sub.writes if sub.allowed else sub.anyway_writes
            record = read(family.check.name, {family.id_param: sub.reservation_id}) if writes else None
            if record is not None:
                found.append((sub.request, writes[0].model_dump(), record, user, sub.allowed))
    return request_examples(found, per_tool=per_tool)


_RULE_LINE = re.compile(r"^[A-Z][\w ]{0,30}:\s")


def split_prompt(prompt: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(lines before the domain rules, the rules, lines after them); a rule line starts with a label
    ("Cancel: …")."""
    lines = [line for line in prompt.strip().splitlines() if line.strip()]
    rules = [i for i, line in enumerate(lines) if _RULE_LINE.match(line)]
    if not rules:
        return tuple(lines), (), ()
    return tuple(lines[:rules[0]]), tuple(lines[rules[0]:rules[-1] + 1]), tuple(lines[rules[-1] + 1:])


@dataclass(frozen=True)
class ToolFamily:
    """A read tool and the write tools that take the same id parameter (simplest first)."""

    check: ToolSchema
    acts: tuple[ToolSchema, ...]
    id_param: str

    @property
    def entity(self) -> str:
        return self.id_param.removesuffix("_id")


def tool_families(tools: tuple[ToolSchema, ...] | list[ToolSchema]) -> list[ToolFamily]:
    """Every (check, acts) family, largest family first; acts ordered simplest first."""
    families = []
    for check in tools:
        if check.kind != "read":
            continue
        required = check.parameters.get("required", [])
        if len(required) != 1 or not required[0].endswith("_id"):
            continue
        id_param = required[0]
        acts = [
            t for t in tools
            if t.kind == "write" and id_param in t.parameters.get("required", [])
            and _is_string(t.parameters.get("properties", {}).get(id_param, {}))
        ]
        if acts:
            acts.sort(key=lambda t: (argument_complexity(t), t.name))
            families.append(ToolFamily(check=check, acts=tuple(acts), id_param=id_param))
    families.sort(key=lambda f: (-len(f.acts), f.check.name))
    return families


def _is_string(spec: dict[str, Any]) -> bool:
    return spec.get("type") == "string"


def argument_complexity(schema: ToolSchema) -> int:
    """How hard a call is to write: scalars count 1, arrays of scalars 2, nested objects 4 per field."""
    defs = schema.parameters.get("$defs", {})

    def cost(spec: dict[str, Any]) -> int:
        if "$ref" in spec:
            spec = defs.get(spec["$ref"].split("/")[-1], {})
        kind = spec.get("type")
        if kind == "array":
            inner = spec.get("items", {})
            return 2 if inner.get("type") in ("string", "integer", "number", "boolean") else 4 * max(1, cost(inner))
        if kind == "object":
            return sum(cost(v) for v in spec.get("properties", {}).values()) or 1
        return 1

    return sum(cost(v) for v in schema.parameters.get("properties", {}).values())


def is_flat(schema: ToolSchema) -> bool:
    """All parameters are scalars or arrays of scalars (no nested objects)."""
    for spec in schema.parameters.get("properties", {}).values():
        if "$ref" in spec or spec.get("type") == "object":
            return False
        if spec.get("type") == "array" and spec.get("items", {}).get("type") not in ("string", "integer", "number", "boolean"):
            return False
    return True
