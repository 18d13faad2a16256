"""TRACE step 1 — contrastive capability selection.

    catalogue   the built-in capabilities (tracerl.contracts.Capability), users' YAML/JSON
    labels      PairLabel / LabelRun, the Labeller interface, label codes
    rules       RulesLabeller: deterministic detectors (the embedded default)
    llm         LLMLabeller over any OpenAI-compatible endpoint; trajectory compaction
    discovery   LLM-proposed capabilities, validated and merged
    aggregate   TRACE's Cov / ER± / Δ / K-of-N, bootstrap intervals, ER+ = 0 flag
    select      label N runs, write labels/run_XX.json and capabilities.json
"""

_EXPORTS = {
    "Aggregate": "tracerl.selection.aggregate", "SelectionParams": "tracerl.selection.aggregate",
    "Capability": "tracerl.contracts", "Rubric": "tracerl.contracts", "CapabilitiesFile": "tracerl.contracts",
    "builtin_capabilities": "tracerl.selection.catalogue", "load_capabilities": "tracerl.selection.catalogue",
    "merge_capabilities": "tracerl.selection.catalogue",
    "LabelRun": "tracerl.selection.labels", "Labeller": "tracerl.selection.labels",
    "PairLabel": "tracerl.selection.labels", "RulesLabeller": "tracerl.selection.rules",
    "capabilities_document": "tracerl.selection.select", "label_runs": "tracerl.selection.select",
    "select_capabilities": "tracerl.selection.select",
}
__all__ = sorted(_EXPORTS)  # the function `aggregate` is `tracerl.selection.aggregate.aggregate` (same name as its module)


def __getattr__(name: str):  # lazy: `tracerl --help` need not import numpy
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
