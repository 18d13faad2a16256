"""`load_rollouts`: the one reader every command that takes rollouts uses.

It accepts a folder of SWE-bench agent trajectories with their evaluation reports
(`tracerl.envs.swebench`), our JSONL (one `Trajectory` per line), a τ²-bench results JSON or a benchmark's own run
(`tracerl.envs.registry.RESULTS_READERS`: ToolSandBox's `result_summary.json`, or the folder holding
it), told apart by content, not by file name: a file whose first non-blank line is a complete JSON
object is JSONL, unless that object is itself a results document (written on one line); anything
else is read as one JSON document and must be one of those results files.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from tracerl.core.errors import InputError
from tracerl.core.io import describe_validation_error, parse_json, read_text
from tracerl.core.tools import ToolSchema, load_tools_json
from tracerl.core.trajectory import Trajectory
from tracerl.envs.swebench import is_swebench_folder, load_swebench
from tracerl.envs.registry import benchmark_of_results, benchmark_results_file, read_benchmark_results
from tracerl.envs.tau2 import is_tau2_results, tau2_trajectories


def load_rollouts(path: str | Path, tools: list[ToolSchema] | str | Path | None = None) -> list[Trajectory]:
    """Read rollouts from our JSONL, a τ²-bench results JSON or a benchmark's own run (detected from content).

    `tools` (a list of schemas, or the path of a tools.json like τ²-bench's) supplies tool
    schemas where the file has none: τ²-bench files without `tool_defs`, and JSONL records with
    an empty `tools` list. Bad input raises a one-line `InputError` naming the file and line.
    """
    path = Path(path)
    if is_swebench_folder(path):  # agent trajectories with their SWE-bench reports (tracerl.envs.swebench)
        return load_swebench(path)
    schemas = load_tools_json(tools) if isinstance(tools, (str, Path)) else tools
    if path.is_dir():  # a benchmark's run folder (ToolSandBox's)
        path = benchmark_results_file(path) or path
    text = read_text(path)
    lines = text.splitlines()
    first = next(((i, line) for i, line in enumerate(lines, start=1) if line.strip()), None)
    if first is None:
        raise InputError("empty file: no rollouts", path=str(path))
    try:
        head = json.loads(first[1])
    except (json.JSONDecodeError, RecursionError):
        head = None
    if isinstance(head, dict) and not is_tau2_results(head) and benchmark_of_results(head) is None:
        return _read_jsonl(lines, str(path), schemas)
    doc = head
    if doc is None:
        doc = parse_json(text, path)
    benchmark = benchmark_of_results(doc)
    if benchmark is not None:
        return read_benchmark_results(benchmark, doc, path=str(path), tools=schemas)
    if not is_tau2_results(doc):
        raise InputError(
            "neither tracerl JSONL (one trajectory object per line), a τ²-bench results file "
            "(a JSON object with 'tasks' and 'simulations') nor ToolSandBox's result_summary.json",
            path=str(path),
            line=first[0],
        )
    return tau2_trajectories(doc, path=str(path), text=text, tools=schemas)


def _read_jsonl(lines: list[str], path: str, tools: list[ToolSchema] | None) -> list[Trajectory]:
    out = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"not valid JSON ({e.msg}, column {e.colno})", path=path, line=lineno) from None
        except RecursionError:
            raise InputError("JSON nested too deeply", path=path, line=lineno) from None
        if not isinstance(data, dict):
            raise InputError("expected a JSON object (one trajectory per line)", path=path, line=lineno)
        try:
            trajectory = Trajectory.model_validate(data)
        except ValidationError as e:
            raise InputError(describe_validation_error(e), path=path, line=lineno) from None
        except RecursionError:
            raise InputError("a record nested too deeply", path=path, line=lineno) from None
        if tools and not trajectory.tools:
            trajectory.tools = [t.model_copy() for t in tools]
        out.append(trajectory)
    if not out:
        raise InputError("empty file: no rollouts", path=path)
    return out
