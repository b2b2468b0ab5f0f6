"""KV-cache sampler for the agent and the trainer: batched prefill with shared-prefix reuse,
an on-device decode loop, per-row stop ids / stop sequences, and shape buckets.

    sampler = Sampler(model, cache_dtype=jnp.bfloat16, mesh=mesh)
    outs = sampler.generate(prompts, max_new_tokens=512, temperature=1.0, top_p=0.99,
                            stop_token_ids=[im_end])
    sampler.update_params(new_model)   # after an optimizer step; no recompilation
"""
from memsearcher_jax.sampling.buckets import BucketConfig, bucket, common_prefix_length
from memsearcher_jax.sampling.distributions import filter_mask, sample_from_logits, token_logprobs
from memsearcher_jax.sampling.sampler import Completion, DecodeState, Sampler, generate, validate_request
from memsearcher_jax.sampling.stopping import find_stop, normalize_stops, pack_stops, push_window, stop_hits

__all__ = ["Sampler", "generate", "Completion", "DecodeState", "BucketConfig", "bucket", "common_prefix_length",
           "filter_mask", "sample_from_logits", "token_logprobs", "find_stop", "normalize_stops", "pack_stops",
           "push_window", "stop_hits", "validate_request"]
