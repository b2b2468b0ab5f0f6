"""The sampler refresh (a GRPO step's last stage): the learner's new weights in the layout the
sampler reads, handed to `sampling/sampler.py::Sampler.update_params` without a recompile."""
from __future__ import annotations

import jax
from flax import nnx

from memsearcher_jax.models import CausalLM, ShardingConfig, shard_model
from memsearcher_jax.rl.learner import Learner
from memsearcher_jax.runtime import distributed


def sampling_model(learner: Learner, mesh, sampler_mesh, dtype: str, params=None) -> CausalLM:
    """The learner's current weights (or `params`, a tree like the learner's: an older version a
    rollout ahead of the learner samples with, rl/async_rollout.py) as the sampler wants them: a
    model over fresh Variables (re-placing it must not move the learner's own params out of the
    training layout), in the TP-only sampling layout on a mesh, as host-local arrays on several
    hosts. LoRA: the learner's model as it lies; its layer_by_layer sampler merges and re-lays it
    out itself."""
    params = learner.params if params is None else params
    if learner.frozen is not None:
        return nnx.merge(learner.graphdef, params, learner.frozen)
    model = nnx.merge(learner.graphdef, jax.tree.map(lambda x: x, params))
    if mesh is not None:
        # The tensors that move are moved in the compute dtype (the Sampler casts to it anyway).
        model = shard_model(model, mesh, ShardingConfig.sampling(), move_dtype=dtype)
    if jax.process_count() > 1:
        # The sampling layout is replicated over data/fsdp and split over tp, which stays inside
        # a host: every host holds a whole copy among its shards. Rebuild it as host-local arrays
        # on the sampler's local mesh (same specs, same devices).
        graphdef, state = nnx.split(model)
        model = nnx.merge(graphdef, distributed.to_local_arrays(state, sampler_mesh))
        model.mesh = sampler_mesh
        model.sharding = ShardingConfig.sampling()
    return model
