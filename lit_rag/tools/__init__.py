"""Tools an agent calls through its chat template's function calling (docs/agents-with-tools.md)."""

from lit_rag.tools.base import (
    ENVIRONMENT_ERRORS,
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
from lit_rag.tools.parsers import PARSERS, Parsed, hermes, llama3, mistral, parser

__all__ = [
    "ENVIRONMENT_ERRORS",
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
    "mistral",
    "parser",
]
