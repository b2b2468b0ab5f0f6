"""The agent's search tool, by name: what the prompt describes and the parser accepts.

Every tool here is a search over the one retriever: its calls carry a query string and an
optional number of passages. A tool is described by an OpenAI-style function schema (the
MemSearcher recipe's `wikipedia_search` is the default); another one comes from config as a
registered name (`agent.tool`) or as a JSON schema (`agent.tool_schema`).

    tool = tool_from_config(name="wikipedia_search", schema_json="")
    tool.schema(default_top_n=5)        # {"type": "function", "function": {...}}
    tool.call_text("Paris founded", 3)  # '<tool_call>{"name": ..., "arguments": {...}}</tool_call>'
"""
from __future__ import annotations

import dataclasses
import json

from memsearcher_jax.errors import UserInputError


class ToolConfigError(UserInputError):
    """A tool name or schema from the config is unusable."""


@dataclasses.dataclass(frozen=True)
class SearchTool:
    name: str = "wikipedia_search"
    description: str = "Search Wikipedia and return the most relevant passages."
    query_arg: str = "query"          # the string argument holding the query
    top_n_arg: str = "top_n"          # the optional integer argument: how many passages

    def schema(self, default_top_n: int) -> dict:
        """The tool as an OpenAI-style JSON function schema."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {
                        self.query_arg: {"type": "string", "description": "The search query."},
                        self.top_n_arg: {"type": "integer",
                                         "description": f"Number of passages to return (default {default_top_n})."},
                    },
                    "required": [self.query_arg],
                },
            },
        }

    def call_text(self, query: str, top_n: int) -> str:
        body = json.dumps({"name": self.name, "arguments": {self.query_arg: query, self.top_n_arg: top_n}})
        return f"<tool_call>{body}</tool_call>"

    @classmethod
    def from_schema(cls, schema: dict) -> SearchTool:
        """A tool from an OpenAI-style function schema: its first required string parameter is
        the query; an integer parameter, if any, the number of passages."""
        fn = schema.get("function", schema) if isinstance(schema, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ToolConfigError(f"agent.tool_schema: expected a function schema with a name, got {schema!r:.200}")
        props = (fn.get("parameters") or {}).get("properties") or {}
        required = (fn.get("parameters") or {}).get("required") or list(props)
        strings = [p for p in required if (props.get(p) or {}).get("type") == "string"]
        if not strings:
            raise ToolConfigError(f"agent.tool_schema {fn['name']!r}: no required string parameter to hold the query "
                                  f"(parameters: {sorted(props)})")
        ints = [p for p, v in props.items() if (v or {}).get("type") == "integer"]
        return cls(name=fn["name"], description=str(fn.get("description", "")), query_arg=strings[0],
                   top_n_arg=ints[0] if ints else "top_n")


DEFAULT_TOOL = SearchTool()
TOOLS: dict[str, SearchTool] = {DEFAULT_TOOL.name: DEFAULT_TOOL}


def register_tool(tool: SearchTool) -> SearchTool:
    TOOLS[tool.name] = tool
    return tool


def tool_spec(name: str = DEFAULT_TOOL.name, schema_json: str = "") -> SearchTool:
    """The tool `agent.tool_schema` (a JSON function schema) describes when given, else the
    registered `agent.tool`; ToolConfigError naming the key. Registers nothing (a config check)."""
    if schema_json:
        try:
            schema = json.loads(schema_json)
        except json.JSONDecodeError as e:
            raise ToolConfigError(f"agent.tool_schema is not valid JSON: {e}") from None
        return SearchTool.from_schema(schema)
    if name not in TOOLS:
        raise ToolConfigError(f"agent.tool={name!r} is not a registered tool; registered: {sorted(TOOLS)} "
                              "(or give agent.tool_schema, a JSON function schema)")
    return TOOLS[name]


def tool_from_config(name: str = DEFAULT_TOOL.name, schema_json: str = "") -> SearchTool:
    """`tool_spec`'s tool, registered when it comes from a schema (the parser then accepts it)."""
    tool = tool_spec(name, schema_json)
    return register_tool(tool) if schema_json else tool
