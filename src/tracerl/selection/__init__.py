"""TRACE step 1 — contrastive capability selection.

    catalogue   the built-in capabilities (tracerl.contracts.Capability), users' YAML/JSON
    labels      the Labeller interface, label codes (the label files: tracerl.contracts.LabelRun)
    rules       RulesLabeller: deterministic detectors (the embedded default)
    llm         LLMLabeller over any OpenAI-compatible endpoint; trajectory compaction
    discovery   LLM-proposed capabilities, validated and merged
    aggregate   TRACE's Cov / ER± / Δ / K-of-N, bootstrap intervals, ER+ = 0 flag
    select      label N runs, write labels/run_XX.json and capabilities.json
"""
