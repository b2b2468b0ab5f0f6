"""memsearcher_jax.data"""
