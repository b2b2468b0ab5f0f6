"""Qwen2.5 and Qwen3 in Flax NNX: config presets, sharding layouts, Hugging Face import/export."""
from memsearcher_jax.models.config import ModelConfig
from memsearcher_jax.models.hf_io import CheckpointError, from_pretrained, param_dict, save_pretrained, shard_model
from memsearcher_jax.models.qwen2 import CausalLM, Qwen2
from memsearcher_jax.models.sharding import ShardingConfig, make_mesh

__all__ = ["ModelConfig", "CausalLM", "Qwen2", "ShardingConfig", "make_mesh", "from_pretrained",
           "save_pretrained", "param_dict", "shard_model", "CheckpointError"]
