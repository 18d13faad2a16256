"""The requirements every synthetic environment must meet, checked by code.

- schema fidelity: each of the env's tools is a tool of the target with the same name, kind and
  parameter signature (names, types, required) — any drift fails;
- determinism: same seed ⇒ same opening, info, oracle and replayed tool results and reward;
  different seeds ⇒ not all the same task;
- oracle: `oracle(seed)` played call by call scores 1.0 on every seed tried (≥ 20);
- do-nothing: a policy that only answers "I can't help with that." scores < 1 on every seed;
- hints: `hint(seed)` gives the task's hint, `reset(seed, options={"hint": True})` puts it in the system
  prompt and changes nothing else (a plain reset of the same seed is the opening without it, which is
  how the trainer strips it), and the hint contains no gold argument value.

`validate_env(make_env, target_tools)` runs them all and returns a `CheckReport`; a check that
raises is a failed check whose detail names the exception — the report is never an exception.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from typing import Any

from tracerl.contracts import CheckReport, CheckResult
from tracerl.core.messages import Action, Message, ToolCall, canonical_json
from tracerl.core.tools import ToolSchema
from tracerl.envs.base import Env
from tracerl.envs.synthetic.sandbox import GeneratedCodeError, SandboxFailure

DEFAULT_SEEDS = tuple(range(20))
DO_NOTHING_TEXT = "I'm sorry, I cannot help with that. Goodbye."
FINAL_TEXT = "All done. Is there anything else?"


def play(env: Env, seed: int, actions: Sequence[Action], *, options: dict[str, Any] | None = None,
         final_text: str = FINAL_TEXT) -> tuple[float, list[Message]]:
    """Play `actions` one call per turn, then `final_text` (and the same again if the user answers);
    returns the reward and every message the env produced."""
    messages, _ = env.reset(seed=seed, options=options)
    transcript = list(messages)
    for i, action in enumerate(actions):
        call = ToolCall.make(action.name, action.arguments, f"call_{i}")
        out, reward, terminated, truncated, _ = env.step(Message.assistant(tool_calls=[call]))
        transcript += out
        if terminated or truncated:
            return reward, transcript
    for _ in range(3):
        out, reward, terminated, truncated, _ = env.step(Message.assistant(final_text))
        transcript += out
        if terminated or truncated:
            return reward, transcript
    return 0.0, transcript


def _guard(name: str, fn: Callable[[], CheckResult]) -> CheckResult:
    try:
        return fn()
    except (GeneratedCodeError, SandboxFailure) as e:  # in a sandboxed module: the text says where
        return CheckResult(name=name, passed=False, detail=f"raised {e}")
    except Exception as e:  # the module under test may raise anything: report it
        where = traceback.extract_tb(e.__traceback__)[-1]
        return CheckResult(name=name, passed=False,
                           detail=f"raised {type(e).__name__}: {e} (at {where.filename}:{where.lineno})")


def check_schema_fidelity(env_tools: Sequence[ToolSchema], target_tools: Sequence[ToolSchema]) -> CheckResult:
    """Every env tool must exist in the target with the same kind and parameter signature."""
    target = {t.name: t for t in target_tools}
    problems = []
    if not env_tools:
        problems.append("the environment offers no tools")
    for tool in env_tools:
        ref = target.get(tool.name)
        if ref is None:
            problems.append(f"tool '{tool.name}' is not a tool of the target")
            continue
        if tool.kind != ref.kind:
            problems.append(f"tool '{tool.name}' is kind '{tool.kind}', the target's is '{ref.kind}'")
        mine, theirs = tool.parameter_signature(), ref.parameter_signature()
        for pname in sorted(set(mine["properties"]) | set(theirs["properties"])):
            a, b = mine["properties"].get(pname), theirs["properties"].get(pname)
            if a is None:
                problems.append(f"tool '{tool.name}' lacks parameter '{pname}'")
            elif b is None:
                problems.append(f"tool '{tool.name}' has parameter '{pname}' the target does not have")
            elif canonical_json(a) != canonical_json(b):
                problems.append(f"tool '{tool.name}' parameter '{pname}' is {canonical_json(a)}, the target's is {canonical_json(b)}")
        if mine["required"] != theirs["required"]:
            problems.append(f"tool '{tool.name}' requires {mine['required']}, the target requires {theirs['required']}")
    detail = "; ".join(problems) if problems else f"{len(env_tools)} tools match the target"
    return CheckResult(name="schema", passed=not problems, detail=detail)


def _fingerprint(env: Env, seed: int) -> tuple[str, str]:
    """(everything reset shows, the opening messages alone)."""
    messages, info = env.reset(seed=seed)
    tools = [t.model_dump() for t in env.tools]
    opening = canonical_json([m.to_openai() for m in messages])
    return canonical_json({"messages": opening, "info": info, "tools": tools}), opening


def check_determinism(make_env: Callable[[], Env], seeds: Sequence[int]) -> CheckResult:
    """Two fresh envs give the same task, oracle and replay for every seed; seeds differ."""
    openings = set()
    for seed in seeds:
        a, b = make_env(), make_env()
        fa, fb = _fingerprint(a, seed), _fingerprint(b, seed)
        if fa != fb:
            return CheckResult(name="determinism", passed=False, detail=f"seed {seed}: two resets give different tasks")
        openings.add(fa[1])
        oa, ob = a.oracle(seed), b.oracle(seed)
        if [x.key() for x in oa] != [x.key() for x in ob]:
            return CheckResult(name="determinism", passed=False, detail=f"seed {seed}: oracle differs between calls")
        ra, ta = play(a, seed, oa)
        rb, tb = play(b, seed, ob)
        if ra != rb or [m.to_openai() for m in ta] != [m.to_openai() for m in tb]:
            return CheckResult(name="determinism", passed=False,
                               detail=f"seed {seed}: replaying the oracle gives different results ({ra} vs {rb})")
    if len(seeds) > 1 and len(openings) == 1:
        return CheckResult(name="determinism", passed=False, detail=f"all {len(seeds)} seeds give the same task")
    return CheckResult(name="determinism", passed=True, detail=f"{len(seeds)} seeds reproducible, {len(openings)} distinct tasks")


def check_oracle(make_env: Callable[[], Env], seeds: Sequence[int]) -> CheckResult:
    failed = []
    for seed in seeds:
        env = make_env()
        reward, _ = play(env, seed, env.oracle(seed))
        if abs(reward - 1.0) > 1e-6:
            failed.append(f"{seed} ({reward:.3g})")
    if failed:
        more = ", …" if len(failed) > 8 else ""
        return CheckResult(name="oracle", passed=False,
                           detail=f"oracle scores < 1 on {len(failed)} of {len(seeds)} seeds: {', '.join(failed[:8])}{more}")
    return CheckResult(name="oracle", passed=True, detail=f"oracle scores 1.0 on {len(seeds)} seeds")


def check_do_nothing(make_env: Callable[[], Env], seeds: Sequence[int]) -> CheckResult:
    rewards = []
    for seed in seeds:
        reward, _ = play(make_env(), seed, [], final_text=DO_NOTHING_TEXT)
        rewards.append(reward)
    bad = [s for s, r in zip(seeds, rewards, strict=True) if r >= 1.0 - 1e-6]
    if bad:
        return CheckResult(name="do_nothing", passed=False, detail=f"doing nothing scores 1 on seeds {bad[:8]}")
    return CheckResult(name="do_nothing", passed=True,
                       detail=f"doing nothing scores {sum(rewards) / len(rewards):.3g} on average (max {max(rewards):.3g})")


def check_hints(make_env: Callable[[], Env], seeds: Sequence[int]) -> CheckResult:
    for seed in seeds:
        env = make_env()
        hint = env.hint(seed)
        if not hint:
            return CheckResult(name="hints", passed=False, detail=f"seed {seed}: the environment gives no hint")
        plain, plain_info = env.reset(seed=seed)
        hinted, info = env.reset(seed=seed, options={"hint": True})
        system = hinted[0].content or "" if hinted and hinted[0].role == "system" else ""
        if hint not in system:
            return CheckResult(name="hints", passed=False, detail=f"seed {seed}: the hint is not in the system prompt")
        if [m.to_openai() for m in hinted[1:]] != [m.to_openai() for m in plain[1:]] or canonical_json(info) != \
                canonical_json(plain_info) or not plain or plain[0].role != "system":
            return CheckResult(name="hints", passed=False,
                               detail=f"seed {seed}: the hinted opening differs from the plain one beyond its system prompt")
        for action in env.oracle(seed):
            for value in _leaves(action.arguments):
                if len(value) >= 3 and value in hint:
                    return CheckResult(name="hints", passed=False,
                                       detail=f"seed {seed}: the hint gives away the gold argument {value!r}")
    return CheckResult(name="hints", passed=True, detail="hints present, strippable, and free of gold arguments")


def _leaves(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    if isinstance(value, list):
        return [x for v in value for x in _leaves(v)]
    return [str(value)]


def validate_env(make_env: Callable[[], Env], target_tools: Sequence[ToolSchema],
                 seeds: Sequence[int] = DEFAULT_SEEDS) -> CheckReport:
    """Run every check; the report lists each with passed/detail."""
    seeds = list(seeds)
    checks = [
        _guard("schema", lambda: check_schema_fidelity(make_env().tools, target_tools)),
        _guard("determinism", lambda: check_determinism(make_env, seeds)),
        _guard("oracle", lambda: check_oracle(make_env, seeds)),
        _guard("do_nothing", lambda: check_do_nothing(make_env, seeds)),
        _guard("hints", lambda: check_hints(make_env, seeds)),
    ]
    return CheckReport(checks=checks)
