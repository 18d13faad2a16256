"""Contract files for tests that need one without running the stage that writes it."""

from pathlib import Path


def capabilities_file(path: Path, selected: list[str], unselected: list[str] = (), *, examples: dict | None = None,
                      descriptions: dict | None = None) -> Path:
    """A capabilities.json (`tracerl.contracts.CapabilitiesFile`) selecting `selected`, with made-up
    figures (they do not matter to the readers under test). `examples` maps a name to its
    (task id, evidence) pairs, `descriptions` a name to its description."""
    from tracerl.contracts import CapabilitiesFile, CapabilityResult, FailedExample

    def result(rank: int, name: str, chosen: bool) -> CapabilityResult:
        failed = [FailedExample(index=i, task_id=t, lacking_runs=1, evidence=e)
                  for i, (t, e) in enumerate((examples or {}).get(name, []))]
        return CapabilityResult(
            name=name, description=(descriptions or {}).get(name, f"{name} description"), selected=chosen, rank=rank, status="PENDING" if chosen else None,
            mean_cov=0.3, std_cov=0.0, cov_ci95=(0.3, 0.3), mean_delta=0.4, std_delta=0.0, delta_ci95=(0.4, 0.4),
            mean_er_minus=0.5, mean_er_plus=0.1, runs_passed=1, runs_total=1, er_plus_empty_runs=0, er_plus_flag=False,
            unlabelled_pairs=0, per_run=[], example_failed=failed)

    names = [(n, True) for n in selected] + [(n, False) for n in unselected]
    CapabilitiesFile.model_validate({
        "params": {"rho": 0.1, "delta": 0.2, "k": 1, "n": 1, "bootstrap": 0, "seed": 0},
        "totals": {"trajectories": 10, "failed": 5, "passed": 5},
        "labeler": {"name": "rules", "deterministic": True, "note": "test"}, "unlabelled_pairs": 0,
        "capabilities": [result(i, n, c) for i, (n, c) in enumerate(names, start=1)],
    }).write(path)
    return path


def samples() -> dict:
    """One instance of each contract file, as its stage would write it (small, made-up figures)."""
    from tracerl.contracts import (
        AdapterRef, CalibrationBands, CalibrationResult, CalibrationRound, CalibrationStats, Capability, CapabilitiesFile,
        CheckReport, CheckResult, CompositionSpec, CurvePoint, EnvCalibration, EnvIndex, EnvRecord, EnvSpec, EvalResult, GateData, GateKept, Headline, PromptCandidate, PromptOptimization, ReportSummary, RoutingAccuracy,
        TraceCurve, TrainRun,
    )
    from tracerl.evaluation.stats import Interval
    from tracerl.synthesis.target import load_target

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        caps = CapabilitiesFile.read(capabilities_file(Path(tmp) / "c.json", ["tool_call_precision"], ["tone_and_empathy"],
                                                       examples={"tool_call_precision": [("7", "wrong id")]}))
    evaluation = EvalResult(variant="adapter:tool_call_precision", pass1=Interval(mean=0.5, low=0.0, high=1.0),
                            pass_k={"1": 0.5}, diff_vs_base=Interval(mean=0.5, low=0.0, high=1.0), rollouts_used=64,
                            n_tasks=2, trials=1, mean_reward=0.5, failures_by_capability={"tool_call_precision": 1},
                            per_task={"test_0": 1.0, "test_1": 0.0})
    composition = CompositionSpec(
        model_name="composed", mode="moe", base="tiny-agent",
        adapters=[AdapterRef(name="tool_call_precision", path="../adapters/tool_call_precision")],
        capabilities=[Capability(name="tool_call_precision", description="exact arguments")],
        slots=["base", "tool_call_precision"], gate_parameters=10,
        routing_accuracy=RoutingAccuracy(overall=1.0, per_capability={"tool_call_precision": 1.0}, num_prompts=2,
                                         method="per-token majority of the gates"))
    stats = CalibrationStats(groups=2, group_size=2, mean_reward=0.25, success_rate=0.0, reward_std=0.25,
                             mean_group_std=0.25, all_success=0.0, all_zero=0.5, constant=0.5, informative=0.5,
                             pass_at_k={"1": 0.0})
    return {
        "capabilities.json": caps,
        "envs/index.json": EnvIndex(target="airline", generator="template", environments=[
            EnvRecord(capability="tool_call_precision", status="DONE", environment="tool_call_precision", source="template",
                      calibration=EnvCalibration(accepted=False, difficulty=0, success_rate=0.0, stop_reason="too hard")),
            EnvRecord(capability="error_recovery", status="FAILED", environment=None, source="-", error="no template")]),
        "envs/tool_call_precision/env.json": EnvSpec(capability="tool_call_precision", template="tool_call_precision",
                                                     target="airline", difficulty=2),
        "envs/tool_call_precision/target.json": load_target("airline").file(),
        "envs/tool_call_precision/checks.json": CheckReport(checks=[
            CheckResult(name="oracle", passed=True, detail="oracle scores 1.0 on 20 seeds"),
            CheckResult(name="hints", passed=False, detail="seed 3: info['_hint'] is empty")]),
        "envs/tool_call_precision/calibration.json": CalibrationResult(
            accepted=False, difficulty=0, stats=stats, rounds=[CalibrationRound(difficulty=0, stats=stats, accepted=False,
                                                                                reasons=["success rate 0.000 outside [0.2, 0.6]"])],
            stop_reason="too hard", bands=CalibrationBands(), policy="tiny-agent", seeds=[0, 1], group_size=2,
            settings={"temperature": 0.7}),
        "adapters/tool_call_precision/train_config.json": TrainRun(
            config={"learning_rate": 1e-5}, base="tiny-agent", env="envs/tool_call_precision", env_digest="0" * 64,
            rollouts="local"),
        "gate_data/summary.json": GateData(rollouts=4, kept={"tool_call_precision": GateKept(trajectories=1, of=4,
                                                                                            source="successful")}),
        "composed/composition.json": composition,
        "eval/adapter-tool_call_precision.json": evaluation,
        "baselines/gepa/result.json": PromptOptimization(
            optimizer="gepa 0.1.4", reflection={"base_url": "http://127.0.0.1:8000/v1", "model": "reflector"},
            budget=20, rollouts_used=13, train_seeds=[0, 1, 2], val_seeds=[3, 4], reflection_minibatch_size=2,
            reflection_calls=2, seed_prompt="Help the user.",
            candidates=[PromptCandidate(prompt="Help the user.", parents=[], val_score=0.0, discovered_at=0),
                        PromptCandidate(prompt="Check first.", parents=[0], val_score=0.5, discovered_at=9,
                                        curve_passed=1, curve_episodes=2)],
            best=1, curve_seeds=[8, 9], log="Iteration 1: …"),
        "curve/curve.json": TraceCurve(variant="trace_moe", composed="../composed", eval_seed_start=1_000_000,
                                       points=[CurvePoint(step=0, rollouts=4, passed=1, episodes=2)]),
        "report/report.json": ReportSummary(
            workspace="ws", headline=Headline(trace=None, base=None, grpo_target=None, prompt_capabilities=None,
                                              trace_vs_grpo_target=None, routing_accuracy=1.0),
            base_rollouts=None, capabilities=caps, calibration={}, trained_rejected=[], training={},
            evaluation={evaluation.variant: evaluation}, routing_accuracy=1.0,
            routing_accuracy_by_capability={"tool_call_precision": 1.0}, composition=composition, sample_efficiency=None,
            examples=[], missing={"training": "not run"}),
    }


# Files in a workspace that are not passed between stages through tracerl.contracts, and why.
NOT_CONTRACTS = (
    ".stages/",  # the stage cache's own records (tracerl.stages)
    "labels/run_",  # selection's per-run labels, for people; no stage reads them
    "/checkpoint/", "/.checkpoint.old/",  # training's resume state (tracerl.training.checkpoint)
    "adapter_config.json",  # PEFT's own file
    "eval/tau2/",  # τ²-bench's own results format, for its tools
    "eval/toolsandbox/",  # ToolSandBox's own run folders (result_summary.json, trajectories/), for its tools
)


def check_workspace(ws: Path) -> dict[str, int]:
    """Read every inter-stage file of a pipeline workspace through its contract; fail on a JSON file
    that has none. Returns how many files each contract read."""
    from tracerl.contracts import (
        CalibrationResult, CapabilitiesFile, CheckReport, CompositionSpec, EnvIndex, EnvSpec, EvalResult, GateData,
        PromptOptimization, ReportSummary, TargetFile, TraceCurve, TrainRun, read_metrics,
    )
    from tracerl.core.io import read_jsonl
    from tracerl.core.trajectory import Trajectory

    readers = [
        ("rollouts/*.jsonl", lambda p: read_jsonl(p, Trajectory)),
        ("capabilities.json", CapabilitiesFile.read),
        ("envs/index.json", EnvIndex.read),
        ("envs/*/calibration.json", CalibrationResult.read),
        ("envs/*/env.json", EnvSpec.read),
        ("envs/*/target.json", TargetFile.read),
        ("envs/*/checks.json", CheckReport.read),
        ("adapters/*/train_config.json", TrainRun.read),
        ("baselines/*/train_config.json", TrainRun.read),
        ("adapters/*/metrics.jsonl", read_metrics),
        ("baselines/*/metrics.jsonl", read_metrics),
        ("baselines/gepa/result.json", PromptOptimization.read),
        ("gate_data/summary.json", GateData.read),
        ("gate_data/*.jsonl", lambda p: read_jsonl(p, Trajectory)),
        ("composed*/composition.json", CompositionSpec.read),
        ("eval/*.json", EvalResult.read),
        ("curve/curve.json", TraceCurve.read),
        ("curve/*/composition.json", CompositionSpec.read),
        ("curve/*.jsonl", lambda p: read_jsonl(p, Trajectory)),
        ("eval/*.jsonl", lambda p: read_jsonl(p, Trajectory)),
        ("report/report.json", ReportSummary.read),
    ]
    read: dict[str, int] = {}
    covered: set[Path] = set()
    for pattern, reader in readers:
        for path in sorted(ws.glob(pattern)):
            assert reader(path) is not None
            covered.add(path)
            read[pattern] = read.get(pattern, 0) + 1
    for path in sorted(ws.rglob("*.json*")):
        rel = "/" + path.relative_to(ws).as_posix()
        if path.suffix in (".json", ".jsonl") and path not in covered:
            assert any(x in rel for x in NOT_CONTRACTS), f"{rel}: a workspace file with no contract"
    return read
