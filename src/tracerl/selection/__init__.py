"""TRACE step 1 — contrastive capability selection.

    catalogue   Capability (name, description, rubric, decoy), the built-ins, users' YAML/JSON
    labels      PairLabel / LabelRun, the Labeller interface, label codes
    rules       RulesLabeller: deterministic detectors (the embedded default)
    llm         LLMLabeller over any OpenAI-compatible endpoint; trajectory compaction
    discovery   LLM-proposed capabilities, validated and merged
    aggregate   TRACE's Cov / ER± / Δ / K-of-N, bootstrap intervals, ER+ = 0 flag
    select      label N runs, write labels/run_XX.json and capabilities.json
"""

from tracerl.selection.aggregate import Aggregate, SelectionParams, aggregate
from tracerl.selection.catalogue import Capability, Rubric, builtin_capabilities, load_capabilities, merge_capabilities
from tracerl.selection.labels import LabelRun, Labeller, PairLabel
from tracerl.selection.rules import RulesLabeller
from tracerl.selection.select import capabilities_document, label_runs, select_capabilities

__all__ = [
    "Aggregate", "Capability", "LabelRun", "Labeller", "PairLabel", "Rubric", "RulesLabeller", "SelectionParams",
    "aggregate", "builtin_capabilities", "capabilities_document", "label_runs", "load_capabilities", "merge_capabilities",
    "select_capabilities",
]
