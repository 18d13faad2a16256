"""The built-in capability templates, by capability name: the tool-family templates (`TEMPLATES`), and a
built-in domain's own capability environments (`tracerl.envs.registry.capability_envs`: the code
domain's), which a target of that domain gets instead."""

from tracerl.envs.registry import capability_envs
from tracerl.envs.synthetic.target import Target
from tracerl.envs.synthetic.templates.base import MAX_DIFFICULTY, Task, TemplateEnv
from tracerl.envs.synthetic.templates.multi_step import MultiStepCompletionEnv
from tracerl.envs.synthetic.templates.precision import ToolCallPrecisionEnv
from tracerl.envs.synthetic.templates.precondition import PreconditionVerificationEnv
from tracerl.envs.synthetic.templates.structured import StructuredDataReasoningEnv

TEMPLATES: dict[str, type[TemplateEnv]] = {
    cls.capability: cls
    for cls in (PreconditionVerificationEnv, MultiStepCompletionEnv, StructuredDataReasoningEnv, ToolCallPrecisionEnv)
}

# Names the selection stage (or a person) may use for the same capability.
ALIASES = {
    "tool_calling_precision": "tool_call_precision",
    "multi_step_task_completion": "multi_step_completion",
    "precondition_checking": "precondition_verification",
    "structured_reasoning": "structured_data_reasoning",
}


def template_for(capability: str, target: Target | None = None) -> type[TemplateEnv] | None:
    """The template class for a capability name (or a known alias of it) on `target`, or None: a built-in
    domain that brings its own capability environments gets those, any other target the tool-family templates."""
    key = capability.strip().lower().replace("-", "_").replace(" ", "_")
    key = ALIASES.get(key, key)
    own = capability_envs(target.source) if target is not None else {}
    return own.get(key) if own else TEMPLATES.get(key)  # type: ignore[return-value]


def template_class(name: str) -> type[TemplateEnv] | None:
    """The class an env.json's `template` names: a tool-family template or a built-in domain's own."""
    return TEMPLATES.get(name) or capability_envs().get(name)  # type: ignore[return-value]


__all__ = ["ALIASES", "MAX_DIFFICULTY", "TEMPLATES", "Task", "TemplateEnv", "template_class", "template_for"]
