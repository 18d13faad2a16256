"""The checker catches schema drift, non-determinism, a failing oracle, a do-nothing success and a leaky hint."""

import random

from tracerl.core.tools import ToolSchema
from tracerl.envs.synthetic.checks import check_schema_fidelity, validate_env
from tracerl.envs.synthetic.templates.multi_step import MultiStepCompletionEnv
from tracerl.envs.synthetic.templates.precondition import PreconditionVerificationEnv


def _drifted(schema: ToolSchema, **changes) -> ToolSchema:
    return schema.model_copy(update=changes, deep=True)


def test_schema_drift_is_caught(retail):
    tool = retail.tool("cancel_pending_order")
    assert check_schema_fidelity([tool], retail.tools).passed
    params = tool.parameters
    retyped = {**params, "properties": {**params["properties"], "reason": {"type": "integer"}}}
    renamed = {**params, "properties": {"id": params["properties"]["order_id"], "reason": params["properties"]["reason"]},
               "required": ["id", "reason"]}
    optional = {**params, "required": ["order_id"]}
    cases = {
        "type": (_drifted(tool, parameters=retyped), "parameter 'reason' is"),
        "name": (_drifted(tool, parameters=renamed), "lacks parameter 'order_id'"),
        "required": (_drifted(tool, parameters=optional), "requires ['order_id']"),
        "kind": (_drifted(tool, kind="read"), "is kind 'read'"),
        "tool": (_drifted(tool, name="cancel_order"), "not a tool of the target"),
    }
    for label, (schema, message) in cases.items():
        result = check_schema_fidelity([schema], retail.tools)
        assert not result.passed and message in result.detail, label
    # a description change is not drift: fidelity is about names, types and required parameters
    assert check_schema_fidelity([_drifted(tool, description="Cancel it.")], retail.tools).passed


def test_env_with_drifted_tool_fails_validation(retail):
    class Drifted(MultiStepCompletionEnv):
        @property
        def tools(self):
            schemas = super().tools
            return [_drifted(schemas[0], kind="write")] + schemas[1:]

    report = validate_env(lambda: Drifted(retail), retail.tools, seeds=range(3))
    assert not report.passed and not report.get("schema").passed


def test_nondeterminism_is_caught(retail):
    class Unseeded(MultiStepCompletionEnv):
        def task(self, seed):
            return self.generate(random.Random())  # ignores the seed

    report = validate_env(lambda: Unseeded(retail), retail.tools, seeds=range(3))
    assert not report.get("determinism").passed
    assert "two resets give different tasks" in report.get("determinism").detail
    assert report.get("oracle").passed is False  # its oracle solves another task than the one played


def test_seed_ignored_is_caught(retail):
    class OneTask(MultiStepCompletionEnv):
        def task(self, seed):
            return super().task(0)

    report = validate_env(lambda: OneTask(retail), retail.tools, seeds=range(5))
    assert report.get("determinism").detail == "all 5 seeds give the same task"


def test_failing_oracle_is_caught(retail):
    class ShortOracle(MultiStepCompletionEnv):
        def oracle(self, seed):
            return super().oracle(seed)[:-1]

    report = validate_env(lambda: ShortOracle(retail), retail.tools, seeds=range(20))
    assert not report.get("oracle").passed and "oracle scores < 1 on 20 of 20 seeds: 0 (0.667), 1 (0.667)" in report.get("oracle").detail
    assert report.get("determinism").passed and report.get("schema").passed


def test_do_nothing_success_is_caught(retail):
    class Lenient(PreconditionVerificationEnv):
        def score(self, task, calls, attempts):
            return 1.0, {}

    report = validate_env(lambda: Lenient(retail), retail.tools, seeds=range(4))
    assert not report.get("do_nothing").passed


def test_leaky_hint_is_caught(retail):
    class Leaky(MultiStepCompletionEnv):
        def generate(self, rng):
            task = super().generate(rng)
            task.hint = "Call " + "; ".join(a.key() for a in task.gold)
            return task

    report = validate_env(lambda: Leaky(retail), retail.tools, seeds=range(2))
    assert not report.get("hints").passed and "gives away the gold argument" in report.get("hints").detail


def test_a_raising_env_is_a_failed_check_not_an_exception(retail):
    class Broken(MultiStepCompletionEnv):
        def oracle(self, seed):
            raise RuntimeError("boom")

    report = validate_env(lambda: Broken(retail), retail.tools, seeds=range(2))
    assert not report.passed
    assert report.get("oracle").detail.startswith("raised RuntimeError: boom")
