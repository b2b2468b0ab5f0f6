"""The Tunix side of bench/peers.py, run in Tunix's own venv (bench/peers_setup.sh) as a
subprocess: it never imports memsearcher_jax. One JSON request per stdin line, one JSON reply
per stdout line; arrays travel in .npz files.

    {"op": "load", "dir": HF_DIR, "config": {...Tunix ModelConfig fields...}}
    {"op": "sample", "prompts": NPZ, "new": 128, "eos": [7] | [], "max_prompt_length": 256}
        -> {"seconds", "tokens": NPZ}   (NPZ holds rows of generated ids, padded with -1)
    {"op": "update_setup", "lr", "clip", "kl_coef", "dual_clip", "micro_batches"}
    {"op": "loss", "batch": NPZ}      -> {"loss"}     (grpo_loss_fn on micro-batch 0, no step)
    {"op": "loss", "batch": NPZ, "all": true} -> {"loss"}  (the mean over every micro-batch, no step)
    {"op": "update", "batch": NPZ}    -> {"seconds"}  (one optimizer step: micro_batches train steps)
    {"op": "logps", "batch": NPZ}     -> {"seconds"}  (per-token log-probs of every micro-batch)

The Tunix pieces driven (tunix 0.1.7): models.qwen2.params.create_model_from_safe_tensors,
generate.sampler.Sampler (greedy; `eos_tokens` is its stop rule: single token ids, no
sequences), sft.peft_trainer.PeftTrainer with rl.algo_core.grpo_loss_fn as its loss (what
Tunix's GRPO learner's actor trainer runs) and optax.MultiSteps gradient accumulation, and
rl.common.compute_per_token_logps (what its GRPO learner uses for old/ref log-probs).
"""
from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tunix.generate import sampler as sampler_lib
from tunix.models.qwen2 import model as model_lib, params as params_lib
from tunix.rl import algo_core, common
from tunix.sft import peft_trainer

PAD = 0


class IdTokenizer:
    """Token ids written as a space-separated string: Tunix's Sampler takes text."""

    def encode(self, text, **kw):
        return [int(t) for t in text.split()]

    def decode(self, ids, **kw):
        return " ".join(str(int(i)) for i in ids)

    def bos_id(self):
        return 0  # falsy: Tunix then prepends no BOS

    def eos_id(self):
        return -1

    def pad_id(self):
        return PAD


class Worker:
    def __init__(self):
        self.model = self.cfg = self.trainer = self.step_fn = None
        self.samplers = {}

    def load(self, req):
        c = req["config"]
        self.cfg = model_lib.ModelConfig(**c, dtype=jnp.float32, param_dtype=jnp.float32)
        self.model = params_lib.create_model_from_safe_tensors(req["dir"], self.cfg, dtype=jnp.float32)
        return {"params": int(sum(x.size for x in jax.tree.leaves(nnx.state(self.model, nnx.Param))))}

    def _sampler(self, cache_size: int):
        if cache_size not in self.samplers:
            cc = sampler_lib.CacheConfig(cache_size=cache_size, num_layers=self.cfg.num_layers,
                                         num_kv_heads=self.cfg.num_kv_heads, head_dim=self.cfg.head_dim)
            self.samplers[cache_size] = sampler_lib.Sampler(self.model, IdTokenizer(), cc)
        return self.samplers[cache_size]

    def sample(self, req):
        prompts = [p[p >= 0].tolist() for p in np.load(req["prompts"])["prompts"]]
        mpl, new = int(req["max_prompt_length"]), int(req["new"])
        sampler = self._sampler(mpl + new)
        # No stop requested: an id that never occurs (Tunix always stops on eos_tokens).
        eos = req["eos"] or [-1]
        t0 = time.perf_counter()
        out = sampler([" ".join(map(str, p)) for p in prompts], max_generation_steps=new, max_prompt_length=mpl,
                      eos_tokens=eos, temperature=0.0)
        dt = time.perf_counter() - t0
        toks = [np.asarray(t).tolist() for t in out.tokens]
        # Tunix cuts a row before its eos; the stop token itself counts as generated (as ours does).
        toks = [t + [eos[0]] if len(t) < new and req["eos"] else t for t in toks]
        grid = np.full((len(toks), new), -1, np.int64)
        for i, t in enumerate(toks):
            grid[i, :len(t)] = t
        path = tempfile.mktemp(suffix=".npz")
        np.savez(path, tokens=grid)
        return {"seconds": dt, "tokens": path}

    def update_setup(self, req):
        algo = types.SimpleNamespace(
            beta=req["kl_coef"], epsilon=req["clip"], epsilon_high=req["clip"], epsilon_c=req["dual_clip"],
            loss_algo="grpo", loss_agg_mode="token-mean", kl_loss_mode="low_var_kl", kl_clamp_value=10.0,
            temperature=1.0)
        self.algo = algo
        self.loss_fn = functools.partial(algo_core.grpo_loss_fn, algo_config=algo, pad_id=PAD, eos_id=-1)
        tx = optax.chain(optax.clip_by_global_norm(1.0),
                         optax.adamw(req["lr"], b1=0.9, b2=0.999, weight_decay=0.01))
        self.micro = int(req["micro_batches"])
        cfg = peft_trainer.TrainingConfig(eval_every_n_steps=10 ** 9, max_steps=10 ** 9,
                                          gradient_accumulation_steps=self.micro if self.micro > 1 else None)
        self.trainer = peft_trainer.PeftTrainer(self.model, tx, cfg)
        self.trainer.with_loss_fn(lambda model, train_example: self.loss_fn(model, train_example), has_aux=True)
        self.trainer.with_gen_model_input_fn(lambda ex: {"train_example": ex})
        self.step_fn, _ = self.trainer.jit_train_and_eval_step()
        return {}

    @staticmethod
    def _examples(path, micro: int):
        d = np.load(path)
        n = d["prompt_ids"].shape[0]
        mb = n // micro
        out = []
        for i in range(micro):
            s = slice(i * mb, (i + 1) * mb)
            out.append(common.TrainExample(
                prompt_ids=jnp.asarray(d["prompt_ids"][s]), prompt_mask=jnp.asarray(d["prompt_ids"][s] != PAD),
                completion_ids=jnp.asarray(d["completion_ids"][s]),
                completion_mask=jnp.asarray(d["completion_mask"][s]), advantages=jnp.asarray(d["advantages"][s]),
                ref_per_token_logps=jnp.asarray(d["ref_logps"][s]), old_per_token_logps=jnp.asarray(d["old_logps"][s])))
        return out

    def loss(self, req):
        """Micro-batch 0's loss (as on our side); "all": the step's, every micro-batch's averaged
        (what optax.MultiSteps' averaged gradient is the gradient of)."""
        exs = self._examples(req["batch"], self.micro)
        fn = nnx.jit(lambda m, e: self.loss_fn(m, e))
        if req.get("all"):
            return {"loss": float(np.mean([float(fn(self.trainer.model, ex)[0]) for ex in exs]))}
        loss, aux = fn(self.trainer.model, exs[0])
        return {"loss": float(loss), "kl": float(aux["kl"]), "clipfrac": float(aux["pg_clipfrac"])}

    def update(self, req):
        exs = self._examples(req["batch"], self.micro)
        t0 = time.perf_counter()
        for ex in exs:
            loss, aux, gnorm = self.step_fn(ex)  # jit_train_and_eval_step binds model and optimizer
        jax.block_until_ready(nnx.state(self.trainer.model))
        return {"seconds": time.perf_counter() - t0, "loss": float(loss)}

    def logps(self, req):
        exs = self._examples(req["batch"], self.micro)
        graphdef, state = nnx.split(self.trainer.model)
        t0 = time.perf_counter()
        for ex in exs:
            lp = common.compute_per_token_logps(graphdef, state, prompt_tokens=ex.prompt_ids,
                                                completion_tokens=ex.completion_ids, pad_id=PAD, eos_id=-1)
        lp.block_until_ready()
        return {"seconds": time.perf_counter() - t0}


def first_to_go_on_oom():
    """If memory runs out, the kernel ends this worker before any other job of a shared machine."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def main():
    first_to_go_on_oom()
    if os.environ.get("PEERS_XLA_CACHE"):  # the bench's own persistent compilation cache for this side
        jax.config.update("jax_compilation_cache_dir", os.environ["PEERS_XLA_CACHE"])
    w = Worker()
    print(json.dumps({"ready": True, "jax": jax.__version__}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        try:
            reply = getattr(w, req["op"])(req)
        except Exception as e:  # the bench reports it and says which op failed
            reply = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
