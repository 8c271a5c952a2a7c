"""`tools` and `tool_choice` -> the tools a request offers and how its calls are constrained.

Validated at the edge, before anything runs: every tool is `{"type": "function", "function": {"name": ...}}` with
`parameters` (when given) a valid JSON Schema object, and a named `tool_choice` names an offered tool; anything else
is 400 invalid_request_error. `tool_choice: "none"` offers no tools at all.

Which requests are grammar-constrained follows `PANTHEON_TOOL_GRAMMAR` (the spec's table, with Pantheon's
default): unset, `required` and a named function compel a call (the worker builds the grammar in the model's
dialect, engine/contract/dialects/grammar.py); `1` also constrains `auto` once a call opens; `0` constrains
nothing, and a named function then behaves like `auto`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jsonschema
from django.conf import settings

from inference.engine.contract.dialects.base import ToolGrammarMode
from pantheon_site.errors import InvalidRequest

CHOICES = ("auto", "none", "required")


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """The tools the model is offered (None: none), and the constraint on its calls (`grammar` None: free;
    `function`: the one function a `required` grammar allows)."""

    tools: list[dict[str, Any]] | None = None
    grammar: ToolGrammarMode | None = None
    function: str | None = None


def plan_tools(tools: list[dict[str, Any]] | None, tool_choice: Any) -> ToolPlan:
    """The plan for a request's `tools` and `tool_choice`; InvalidRequest when either is malformed."""
    choice, function = _choice_of(tool_choice)
    if not tools:
        if choice == "required" or function is not None:
            raise InvalidRequest("tool_choice asks for a tool call but the request offers no tools")
        return ToolPlan()
    for index, tool in enumerate(tools):
        _check_tool(index, tool)
    if choice == "none":
        return ToolPlan()
    names = {tool["function"]["name"] for tool in tools}
    if function is not None and function not in names:
        raise InvalidRequest(f"tool_choice names function {function!r}, which is not among the tools")
    mode = settings.PANTHEON_TOOL_GRAMMAR
    if mode == "0":
        return ToolPlan(tools=tools)
    if choice == "required" or function is not None:
        return ToolPlan(tools=tools, grammar="required", function=function)
    return ToolPlan(tools=tools, grammar="auto" if mode == "1" else None)


def _choice_of(tool_choice: Any) -> tuple[str, str | None]:
    """(auto | none | required | function, the function's name for the last)."""
    if tool_choice is None:
        return "auto", None
    if isinstance(tool_choice, str):
        if tool_choice not in CHOICES:
            raise InvalidRequest(f"tool_choice must be one of {', '.join(CHOICES)} or a function, not {tool_choice!r}")
        return tool_choice, None
    if not isinstance(tool_choice, dict):
        raise InvalidRequest('tool_choice must be a string or {"type": "function", "function": {"name": ...}}')
    function = tool_choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if tool_choice.get("type") != "function" or not isinstance(name, str) or not name:
        raise InvalidRequest('tool_choice must be a string or {"type": "function", "function": {"name": ...}}')
    return "function", name


def _check_tool(index: int, tool: dict[str, Any]) -> None:
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, dict):
        raise InvalidRequest(f'tools[{index}] must be {{"type": "function", "function": {{...}}}}')
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise InvalidRequest(f"tools[{index}].function.name must be a non-empty string")
    parameters = function.get("parameters")
    if parameters is None:
        return
    if not isinstance(parameters, dict):
        raise InvalidRequest(f"tools[{index}].function.parameters must be a JSON Schema object")
    try:
        jsonschema.validators.validator_for(parameters).check_schema(parameters)
    except jsonschema.SchemaError as exc:
        raise InvalidRequest(f"tools[{index}].function.parameters is not valid JSON Schema: {exc.message}") from None
