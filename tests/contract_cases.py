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
