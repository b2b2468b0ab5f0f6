"""memsearcher-jax: train LLM search agents with multi-context GRPO (MemSearcher) in JAX.

Layers point one way: models <- sampling <- agent <- rl. `retrieval` (a top-level package)
stands apart and is reached through `retrieval.base.Retriever`.
"""
import logging

__version__ = "0.1.0"


class _NoTorchNotice(logging.Filter):
    """transformers announces "PyTorch was not found" at import; the library never uses torch
    (only the tests do), so that one notice is dropped. Every other warning passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("PyTorch was not found")


# Installed on the logger transformers will use, before anything here imports transformers.
logging.getLogger("transformers").addFilter(_NoTorchNotice())
