"""memsearcher_jax.eval"""
