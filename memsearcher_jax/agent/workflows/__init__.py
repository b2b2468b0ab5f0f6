"""Registered workflows: importing this package registers the built-in ones, in this order."""
from memsearcher_jax.agent.workflows import memsearcher  # noqa: F401  (registers; order = listing order)
from memsearcher_jax.agent.workflows import react  # noqa: F401
from memsearcher_jax.agent.workflows import mem1  # noqa: F401
from memsearcher_jax.agent.workflows import memory_ops  # noqa: F401
from memsearcher_jax.agent.workflows.base import Workflow, get_workflow, register, workflow_names

__all__ = ["Workflow", "get_workflow", "register", "workflow_names"]
