"""System-prompt pieces every tool-use domain here shares: the expert-guidance section and the
one-request-at-a-time rule (the scripted user gives its requests one at a time)."""

from __future__ import annotations

NEXT_REQUEST_RULE = "Handle one request at a time: when it is done or denied, ask the user for the next request."


def rule_hint(entity: str, check_tool: str) -> str:
    """Expert guidance for a request a domain's rules decide: how to go about it, never its decision.
    The airline's own hint and the precondition template's on a target's requests, in the same words."""
    return (f"Before changing a {entity}, look it up with {check_tool} and compare it with the policy's rule for the "
            "request. Act only if the rule allows it; otherwise make no change and tell the user why.")


def with_hint(system: str, hint: str) -> str:
    """A system prompt with its expert-guidance section."""
    return f"{system}\n\n## Expert guidance\n{hint}"
