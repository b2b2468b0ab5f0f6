"""memsearcher_jax.agent"""
