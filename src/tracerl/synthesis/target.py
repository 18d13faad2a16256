"""Build the target a synthetic environment imitates (`tracerl.envs.synthetic.target.Target`) from a domain.

A target is an environment tracerl can play (a built-in domain such as "airline", an installed or
`package.module:factory` environment: `target_from_env`), a τ²-bench domain given by its tools.json
(a `policy.md` next to it, if any, gives the prompt title), or a τ²-bench domain played live
(`target_from_live_env`: its tools, policy title and gold actions' values, no tools.json needed).
A policy file (`target.policy`, `--policy`) replaces the policy a target states: its title, preamble,
domain rules and closing lines (`with_policy`), and the text the LLM environment writer is given.
The prompt format is kept as `preamble` and `closing` lines: for an environment, its own system
prompt minus its domain rules (the lines that start with a label such as "Cancel:"), which a
synthetic environment replaces with its own rules; for a tools.json, the policy's title.
`result_examples` keeps one observed JSON result per tool (for an environment, from its oracle's
rollouts; `observed_result_examples` takes them from any trajectories), so templates can answer in
the target's record and write-result shapes; `request_examples` keeps the target users' own
wording of a request for each write tool (`Env.user_requests`), with the record and user it was
made on, the write that serves it and whether the target's rules (`rules`) allowed it there, so
templates can ask the target's own requests on records where its rules decide them as they did.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from tracerl.core.errors import InputError
from tracerl.core.messages import Message, ToolCall
from tracerl.core.tools import load_tools_json
from tracerl.envs.base import Env
from tracerl.envs.registry import capability_envs, make_env
from tracerl.envs.runner import Episode, rollout
from tracerl.envs.synthetic.target import Target, tool_families


def load_target(spec: str, policy: str | Path | None = None) -> Target:
    """A path to a τ²-bench-style tools.json, or an environment (`target_from_env`); `policy`, a file of
    the domain's policy text (`target.policy`), replaces the policy the target states itself."""
    path = Path(spec)
    if path.suffix == ".json" or path.is_file():
        target = target_from_tools_json(path)
    else:
        target = target_from_env(spec)
    return target if policy is None else with_policy(target, read_policy(policy))


def read_policy(path: str | Path) -> str:
    """The policy text of a file (`target.policy`); an InputError for a missing or empty one."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise InputError("no such policy file", path=str(path)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read the policy file ({e})", path=str(path)) from None
    if not text.strip():
        raise InputError("the policy file is empty", path=str(path))
    return text.strip()


def with_policy(target: Target, policy: str) -> Target:
    """`target` stating the domain's `policy`: its title (the first '#' line, else the target's), its lines
    before the domain rules, the rules ("Label: …" lines; `split_prompt`) and the lines after them, and
    the whole text for the LLM environment writer."""
    preamble, rules, closing = split_prompt(policy)
    heading = next((line.strip() for line in preamble if line.startswith("#")), None)
    title = heading or target.title
    if heading is None:
        preamble = (title, *preamble)
    return replace(target, title=title, preamble=preamble, rules=rules, closing=closing, policy=policy)


def target_from_tools_json(path: Path) -> Target:
    """The target of a tools.json (`tracerl tools` writes one). A `policy.md` beside it (τ²-bench's domain
    folders have one) gives the title and, to the LLM environment writer, the policy text; its lines go in
    the templates' prompts only when it is given as `target.policy` (`load_target`)."""
    if not path.exists():
        raise InputError("no such file (the target is an environment or a path to a tools.json)", path=str(path))
    tools = load_tools_json(path)
    name = path.parent.name or path.stem
    title = f"# {name.capitalize()} agent policy"
    target = Target(name=name, tools=tuple(tools), title=title, source=str(path), preamble=(title,))
    if not tool_families(target.tools):
        raise InputError("no read tool shares an id parameter with a write tool: nothing to build on", path=str(path))
    beside = path.parent / "policy.md"
    if not beside.exists():
        return target
    policy = read_policy(beside)
    heading = next((line.strip() for line in policy.splitlines() if line.strip()), "")
    title = heading if heading.startswith("#") else title
    return replace(target, title=title, preamble=(title,), policy=policy)


def target_from_env(spec: str) -> Target:
    """The target of an environment tracerl plays (`tracerl.envs.registry.make_env(spec)`): its tools, its
    system prompt split into preamble, domain rules and closing, id values from its gold actions, record
    shapes from its oracle's rollouts (`Env.reference_policy('oracle')`, where it has one) and its users'
    requests (`Env.user_requests`, where it states them). A built-in domain that brings its own
    capability environments (the code domain) gives its tools and prompt only: those read nothing else."""
    env = make_env(spec)
    if capability_envs(spec):
        messages, _ = env.reset(seed=env.task_seeds(1)[0])
        prompt = messages[0].content or "" if messages and messages[0].role == "system" else ""
        title = prompt.splitlines()[0] if prompt else f"# {env.name.capitalize()} agent policy"
        return Target(name=env.name, tools=tuple(env.tools), title=title, source=spec,
                      preamble=tuple(prompt.splitlines()), policy=prompt.strip())
    if not tool_families(tuple(env.tools)):
        raise InputError(f"target '{spec}': no read tool shares an id parameter with a write tool: nothing to build on")
    messages, _ = env.reset(seed=0)
    prompt = messages[0].content or "" if messages and messages[0].role == "system" else ""
    preamble, rules, closing = split_prompt(prompt)
    title = preamble[0] if preamble else f"# {env.name.capitalize()} agent policy"
    return Target(name=env.name, tools=tuple(env.tools), title=title, source=spec,
                  preamble=preamble or (title,), closing=closing, rules=rules, value_examples=gold_value_examples(env),
                  result_examples=oracle_result_examples(spec, env), request_examples=task_request_examples(env),
                  policy=prompt.strip())


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


def target_from_live_env(env: Any, trajectories: list[Any] = (), source: str | None = None) -> Target:
    """The target of a live environment that states its system prompt and gold actions without playing
    (a τ²-bench domain, `tracerl.envs.tau2_live`; ToolSandBox, `tracerl.envs.toolsandbox`): its tool
    schemas, the title of its policy (its prompt's first "# " line, else its first line), id values
    from the gold actions of its tasks (`env.oracle`) and record shapes from `trajectories` it played.
    `source` names it (default 'tau2:<name>')."""
    source = source or f"tau2:{env.name}"
    lines = [line.strip() for line in env.system_prompt.splitlines() if line.strip()]
    titles = [line for line in lines if line.startswith("# ")]
    title = titles[0] if titles else lines[0] if lines else f"# {env.name.capitalize()} agent policy"
    gold = ([a.model_dump() for a in env.oracle(seed)] for seed in env.task_seeds(len(env.task_ids)))
    tools = tuple(env.tools)
    target = Target(name=env.name, tools=tools, title=title, source=source, preamble=(title,),
                    value_examples=value_examples(gold),
                    result_examples=observed_result_examples(list(trajectories), {t.name for t in tools}))
    if not tool_families(target.tools):
        raise InputError(f"{source}: no read tool shares an id parameter with a write tool: nothing to build on")
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


def oracle_result_examples(spec: str, env: Env, seeds: int = 20) -> dict[str, dict[str, Any]]:
    """`observed_result_examples` of the environment's oracle policy on its first seeds ({} without one)."""
    try:
        oracle = env.reference_policy("oracle")
    except ValueError:
        return {}
    trajectories = rollout(lambda: make_env(spec), oracle, [Episode(seed=s) for s in range(seeds)])
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


def task_request_examples(env: Env, seeds: Iterable[int] = range(1000), per_tool: int = 300) -> dict[str, list[dict[str, Any]]]:
    """The environment's users' requests on the task `seeds` (`Env.user_requests`; {} where it states none),
    each with the write that serves it (or would, ignoring the rules), the record it is about and the
    user's record as the read tools return them (the user's id and record list left out), and whether
    the rules allow it (see `request_examples`)."""
    family = tool_families(tuple(env.tools))[0]
    user_tool = next((t.name for t in env.tools if t.kind == "read" and t.parameters.get("required") == ["user_id"]
                      and t.name != family.check.name), None)

    def read(name: str, arguments: dict[str, Any]) -> dict[str, Any] | None:
        result = env.step(Message.assistant(tool_calls=[ToolCall.make(name, arguments, "read")]))[0][0].content or ""
        return json.loads(result) if result.startswith("{") else None

    found = []
    for seed in seeds:
        try:
            requests = env.user_requests(seed)
        except NotImplementedError:
            return {}
        env.reset(seed=seed)
        user_id = next((r.user_id for r in requests if r.user_id), None)
        user = (read(user_tool, {"user_id": user_id}) or {}) if user_tool and user_id else {}
        user = {k: v for k, v in user.items() if k not in ("user_id", f"{family.entity}s")}
        for request in requests:
            record = read(family.check.name, {family.id_param: request.record_id}) if request.write else None
            if record is not None:
                found.append((request.text, request.write.model_dump(), record, user, request.allowed))
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


