"""memsearcher-jax: train LLM search agents with multi-context GRPO (MemSearcher) in JAX.

Layers point one way: models <- sampling <- agent <- rl. `retrieval` (a top-level package)
stands apart and is reached through `retrieval.base.Retriever`.
"""
__version__ = "0.1.0"
