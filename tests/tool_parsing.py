"""A whole output parsed at once, as the tests compare it: the streaming parser the API edge uses, pushed the text in
one piece and flushed."""

from inference.engine.contract.dialects.base import ToolDialect
from inference.engine.contract.dialects.parser import ToolCall, ToolCallError, ToolCallParser


def parse_tool_calls(
    dialect: ToolDialect, tools: list[dict], text: str
) -> tuple[str | None, list[ToolCall], ToolCallError | None]:
    """(content, calls, error); content is None when calls were parsed and no other text is left."""
    parser = ToolCallParser(dialect, tools)
    content = parser.push(text)[0] + parser.flush()[0]
    return (None if parser.calls and not content else content), parser.calls, parser.error
