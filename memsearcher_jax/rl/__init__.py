"""memsearcher_jax.rl"""
