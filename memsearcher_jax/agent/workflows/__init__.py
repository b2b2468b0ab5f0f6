"""Registered workflows. Importing this package imports every module in it, and each module's
`@register` makes its workflow selectable: adding a workflow is adding a file here."""
import importlib
import pkgutil

# First, in the listing's order (the rest follow by file name).
from memsearcher_jax.agent.workflows import memsearcher, react, mem1, memory_ops, summary, fold  # noqa: F401, I001
from memsearcher_jax.agent.workflows.base import (
    AgentBudgets,
    ScriptRecorder,
    Workflow,
    get_workflow,
    recorded_workflows,
    register,
    workflow_names,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["AgentBudgets", "ScriptRecorder", "Workflow", "get_workflow", "recorded_workflows", "register",
           "workflow_names"]
