"""Baselines TRACE is measured against that are not GRPO on the target: GEPA (`gepa`)."""
