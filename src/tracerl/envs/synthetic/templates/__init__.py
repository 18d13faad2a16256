"""The built-in capability templates, by capability name."""

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


def template_for(capability: str) -> type[TemplateEnv] | None:
    """The template class for a capability name (or a known alias of it), or None."""
    key = capability.strip().lower().replace("-", "_").replace(" ", "_")
    return TEMPLATES.get(ALIASES.get(key, key))


__all__ = ["ALIASES", "MAX_DIFFICULTY", "TEMPLATES", "Task", "TemplateEnv", "template_for"]
