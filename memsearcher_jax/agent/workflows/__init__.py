"""Registered workflows. Importing this package imports every module in it, and each module's
`@register` makes its workflow selectable: adding a workflow is adding a file here."""
import importlib
import pkgutil

from memsearcher_jax.agent.workflows import memsearcher, react  # noqa: F401  (first: the listing's order)
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
