"""Tools an agent calls through its chat template's function calling (docs/agents-with-tools.md)."""

from lit_rag.tools.base import (
    ERRORS,
    FunctionTool,
    ServerDied,
    Tool,
    ToolBox,
    ToolCall,
    ToolError,
    ToolResult,
    build_tools,
)
from lit_rag.tools.parsers import PARSERS, Parsed, hermes, llama3, parser

__all__ = [
    "ERRORS",
    "PARSERS",
    "FunctionTool",
    "Parsed",
    "ServerDied",
    "Tool",
    "ToolBox",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "hermes",
    "build_tools",
    "llama3",
    "parser",
]
