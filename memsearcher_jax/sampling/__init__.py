"""memsearcher_jax.sampling"""
