"""LLM-written environments: ask the analysis model (`tracerl.models.analysis`) for an env module,
check it in the sandbox, feed the failures back, up to `max_rounds` rounds.

The model gets the capability (name, description), a few example failed trajectories, the
target's tool schemas, the domain's policy text (`Target.policy`: the rules its environment must
state) and the module contract (below); it answers with one Python code block. An answer without
one is asked again (the client's retries) and counted unusable; a round whose request never got an
answer, when no request has, stops with one line (`InputError`): the endpoint is not there.
Each answer is written with target.json into a staging folder and checked by
`run_in_sandbox`; on failure the check report (or the crash) goes back as the next user turn.
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from tracerl.core.errors import InputError
from tracerl.core.io import atomic_write_text
from tracerl.envs.synthetic.envdir import MODULE_PY, TARGET_JSON
from tracerl.envs.synthetic.target import Target
from tracerl.models.analysis import AnalysisClient
from tracerl.synthesis.sandbox import SandboxLimits, SandboxResult, run_in_sandbox

CONTRACT = """\
Write ONE self-contained Python module (answer with a single ```python code block) that defines
`make_env(difficulty: int) -> tracerl.envs.base.Env`. Requirements, all checked by code:
- Subclass `tracerl.envs.base.ToolEnv` and implement `_setup(seed, options) -> (toolbox, opening_messages, info)`,
  `_user_reply(text) -> (reply or None, user_ends_chat)`, `_score() -> (reward in [0,1], breakdown dict)`,
  and `oracle(seed) -> list[tracerl.core.messages.Action]` (the gold tool calls, one per turn; after them the
  checker sends one final text message, which the user simulator must answer by ending the chat).
- Tools: use ONLY the target's tools, with their schemas verbatim: the file `target.json` next to the module
  holds them (`Target.from_json(json.loads(text))` from `tracerl.envs.synthetic.target`; `target.tool(name)` gives a
  `ToolSchema`). Register each with `tracerl.envs.tools.add_schema_tool(toolbox, schema, handler)`; handlers get
  the validated arguments as keyword arguments, return a JSON-able dict, and raise `tracerl.envs.tools.ToolError`
  for domain errors. Use 2-5 tools.
- The task comes from the seed only (`random.Random(f"...{difficulty}|{seed}")`): same seed => same task;
  different seeds => different tasks. `difficulty` (0-4) adds records, constraints or steps.
- Opening messages: a short system prompt starting with the target's title line, then the user's request. Where the
  domain's policy is given below, the system prompt states the rules of it that bear on the task, in its words;
  invent no rule that contradicts it.
- Reward: computed by code from the tool calls, the state and the final answer (no LLM judge); multi-level where
  it makes sense; 1.0 only when the task is solved. The oracle must score 1.0; saying only
  "I'm sorry, I can't help with that." must score < 1. Judge decisions from every call the agent made, failed
  ones included (a forbidden write that failed on a mistyped id is still a violation), and give the decision
  its own share of the reward apart from the exact execution.
- Hints: implement `hint(seed) -> str` (an expert-guidance paragraph for that task); when
  `options.get("hint")`, append it to the system prompt and change nothing else in the opening or info. The hint
  guides; it must not contain any argument value of the gold calls.
- The environment must isolate the capability: success should depend mainly on it.
- No network, no subprocesses, no files written outside the module's own folder.
"""


# A minimal module that passes every check (it isolates nothing in particular): shown to the model.
EXAMPLE_MODULE = files("tracerl.synthesis").joinpath("example_env_module.txt").read_text()


@dataclass
class GenerationRound:
    round: int
    ok: bool
    problem: str  # what failed (empty when ok)


@dataclass
class GenerationResult:
    ok: bool
    source: str | None  # the accepted module's code
    rounds: list[GenerationRound] = field(default_factory=list)
    sandbox: SandboxResult | None = None

    @property
    def last_problem(self) -> str:
        return self.rounds[-1].problem if self.rounds else "no rounds ran"


def build_prompt(capability: dict[str, Any], target: Target, examples: list[str]) -> list[dict[str, str]]:
    """The opening chat of a generation: contract, capability, failures, tool schemas."""
    tools = json.dumps([{**t.to_openai()["function"], "kind": t.kind} for t in target.tools], indent=1)
    shown = "\n\n".join(f"--- example {i + 1} ---\n{e}" for i, e in enumerate(examples[:3])) or "(none given)"
    policy = (f"The domain's policy (its rules are the ones your environment states):\n{target.policy}\n\n"
              if target.policy else "")
    user = (
        f"Target domain: {target.name} (system prompt title: {target.title!r}).\n\n{policy}"
        f"Capability to train: {capability['name']}\n{capability.get('description', '')}\n\n"
        f"Example failed trajectories of the agent:\n{shown}\n\n"
        f"Target tool schemas (name, description, parameters, kind):\n{tools}\n"
    )
    return [
        {"role": "system", "content": "You write verifiable training environments for tool-using LLM agents.\n\n"
                                      + CONTRACT + "\nA minimal module that passes every check (yours must also isolate "
                                      "the capability):\n```python\n" + EXAMPLE_MODULE + "```\n"},
        {"role": "user", "content": user},
    ]


def extract_code(text: str) -> str | None:
    """The longest ```python block of an answer (or the whole answer if it has no fence but looks like code)."""
    blocks = re.findall(r"```(?:python|py)?\s*\n(.*?)```", text or "", flags=re.DOTALL)
    if blocks:
        return max(blocks, key=len)
    if text and "def make_env" in text:
        return text
    return None


def module_code(answer: str) -> str:
    """The module an answer holds (`extract_code`); a ValueError for an answer without one (unusable)."""
    code = extract_code(answer)
    if code is None:
        raise ValueError("the answer has no ```python code block")
    return code


def generate_env_module(
    capability: dict[str, Any],
    target: Target,
    client: AnalysisClient,
    *,
    examples: list[str] | None = None,
    max_rounds: int = 5,
    limits: SandboxLimits | None = None,
    temperature: float = 0.2,
) -> GenerationResult:
    """Ask the analysis model for a module until one passes the sandbox checks."""
    messages = build_prompt(capability, target, examples or [])
    rounds: list[GenerationRound] = []
    last: SandboxResult | None = None
    for k in range(1, max_rounds + 1):
        code, problem = client.reply(messages, module_code, max_tokens=client.config.writer_max_tokens,
                                     temperature=temperature)
        if code is None:
            if client.stats.answered == 0:  # nothing ever came back: the endpoint is not there
                raise InputError(f"analysis model {client.where}: no answer to the environment writer's requests "
                                 f"({client.stats.summary()}); last: {problem}")
            rounds.append(GenerationRound(round=k, ok=False, problem=problem or "no answer"))
            continue
        last = check_module_source(code, target, limits)
        if last.ok:
            rounds.append(GenerationRound(round=k, ok=True, problem=""))
            return GenerationResult(ok=True, source=code, rounds=rounds, sandbox=last)
        problem = last.summary()
        rounds.append(GenerationRound(round=k, ok=False, problem=problem))
        messages = messages + [
            {"role": "assistant", "content": f"```python\n{code}```"},
            {"role": "user", "content": f"The module failed the checks:\n{problem}\n\nFix it and answer with the whole module."},
        ]
    return GenerationResult(ok=False, source=None, rounds=rounds, sandbox=last)


def check_module_source(code: str, target: Target, limits: SandboxLimits | None = None) -> SandboxResult:
    """Write `code` and target.json to a staging folder and check them in the sandbox."""
    with tempfile.TemporaryDirectory(prefix="tracerl-envgen-") as tmp:
        folder = Path(tmp)
        atomic_write_text(folder / MODULE_PY, code)
        target.file().write(folder / TARGET_JSON)
        return run_in_sandbox(folder, limits)
