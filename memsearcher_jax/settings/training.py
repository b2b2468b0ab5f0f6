"""How a run trains: the supervised warm start, GRPO, the optimizer and the run's length, cadence
and files. Defaults: the paper recipe's (configs/memsearcher_qwen2_5_3b.py; docs/method.md §2)."""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import os
from collections.abc import Callable

from memsearcher_jax.data.demos import EARLY_SEVERAL, EARLY_TWO_HOP, NO_RESULT_NOTE, no_result_note_problem
from memsearcher_jax.settings.fields import Section, TrainConfigError, flag_problems, setting, share_problems

# The warm start's counts and their least values (SFTConfig's and the demonstrator's; sft.steps=-5
# ran with no warm start and exit 0, the others ended in a ValueError once the warm start began).
SFT_COUNTS = {"steps": 0, "batch_size": 1, "warmup": 0, "min_len": 2, "num_demos": 1}
SFT_FLAWS = ("vague_query_rate", "wrong_answer_rate", "early_answer_rate")  # at most one flaw a demonstration


@dataclasses.dataclass(frozen=True)
class SFTSettings(Section):
    """The supervised warm start on the scripted demonstrator's episodes, with its deliberate flaws."""
    key = "sft"
    passes: float = setting(0.0, "> 0: the warm start's length in passes over its rows instead of sft.steps")
    steps: int = setting(0, "supervised warm-start steps before GRPO (0: none, as the recipe's instruction-tuned "
                            "model needs)")
    batch_size: int = setting(16, "rows per warm-start step")
    learning_rate: float = setting(1e-3, "the warm start's peak learning rate")
    warmup: int = setting(20, "the warm start's linear warm-up steps (at most sft.steps)")
    min_len: int = setting(128, "rows pad to quarter-octave buckets from here (sampling/buckets.py)")
    max_batch_tokens: int = setting(0, "a batch padded past this many slots (rows x bucket) updates over micro-batches "
                                       "of at most this many, gradients summed (0: one program a batch)")
    num_demos: int = setting(600, "training questions the demonstrator scripts")
    tie_embedding_rows: str | bool = setting("auto", "move name and value embedding rows together per type, as "
                                                     "pretraining did; auto: where the model has a reading vocabulary "
                                                     "(docs/lab/2026-11-29-reading-v8-ships.md)")
    name_swap_rate: float = setting(0.0, "share of demonstrations whose names are swapped for reading-vocabulary "
                                         "names the world never uses (data/name_swap.py)")
    vague_query_rate: float = setting(0.1, "the demonstrator's flaw: a vague or wrong-entity first search, then a "
                                           "recovery search (share of demonstrations)")
    wrong_answer_rate: float = setting(0.05, "the demonstrator's flaw: every hop searched, the boxed answer wrong")
    early_answer_rate: float = setting(0.5, "the demonstrator's flaw: an answer before every hop is found, a habit "
                                            "only reward corrects "
                                            "(docs/lab/2026-11-29-demonstrator-at-half-reading-v7-ships.md)")
    two_hop_early_rate: float = setting(0.0, "share of 2-hop demonstrations that stop after hop 1 (drawn apart from "
                                             "the flaws)")
    early_two_hop: str = setting("no_search", 'how an early 2-hop answer stops: "no_search" guesses before any '
                                              'search; "first_hop" boxes the bridge entity '
                                              "(docs/lab/2026-11-26-why-seed-2-learns-slowly.md)")
    early_several: str = setting("first_hop", 'several objectives: "first_hop" stops one 2-hop objective after its '
                                              'first hop; "skip" leaves one unsearched')
    react_share: float = setting(0.0, "share of demonstrations recorded in the ReAct format (bench/context.py: 0.5)")
    no_result_note: str = setting(NO_RESULT_NOTE, "what a search that found nothing leaves in memory ({s}: the "
                                                  "subject; "
                                                  "docs/lab/2026-11-30-default-job-after-the-no-result-note.md)")
    demo_objectives: str = setting("", 'objective counts of the demonstrations in equal shares ("1,2"); "": the '
                                       "training questions' counts")

    def problems(self, training: bool = True) -> list[str]:
        """The demonstrator's modes and note, the micro-batch split; for training, the warm start's
        counts and shares (count_problems) and its settings read only once it runs."""
        problems = []
        if self.early_two_hop not in EARLY_TWO_HOP:
            problems.append(f"sft.early_two_hop must be one of {', '.join(EARLY_TWO_HOP)}, got {self.early_two_hop!r}")
        if self.early_several not in EARLY_SEVERAL:
            problems.append(f"sft.early_several must be one of {', '.join(EARLY_SEVERAL)}, got "
                            f"{self.early_several!r}")
        if why := no_result_note_problem(self.no_result_note):
            problems.append(why)
        if self.max_batch_tokens < 0:
            problems.append(f"sft.max_batch_tokens={self.max_batch_tokens}: padded slots per SFT micro-batch, "
                            "expected >= 0 (0: no split)")
        if not training:  # an evaluation runs no warm start
            return problems
        problems += self.count_problems() + flag_problems(self.tie_embedding_rows, "sft.tie_embedding_rows")
        if self.passes < 0:
            problems.append(f"sft.passes={self.passes}: passes over the warm start's rows, expected >= 0 "
                            "(0: use sft.steps)")
        return problems + share_problems("sft", {"name_swap_rate": self.name_swap_rate})

    def count_problems(self) -> list[str]:
        """The warm start's counts, learning rate and shares of the demonstrations (its flaws, which
        share the demonstrations and so sum to <= 1; the two-hop and ReAct shares), each named."""
        problems = [f"sft.{key} must be >= {low}{' (0: no warm start)' if key == 'steps' else ''}, got {self[key]}"
                    for key, low in SFT_COUNTS.items() if self[key] < low]
        if not self.learning_rate > 0:
            problems.append(f"sft.learning_rate must be > 0, got {self.learning_rate}")
        problems += share_problems("sft", {k: self[k] for k in (*SFT_FLAWS, "two_hop_early_rate", "react_share")})
        flaws = sum(self[k] for k in SFT_FLAWS)
        if flaws > 1 + 1e-9 and all(0 <= self[k] <= 1 for k in SFT_FLAWS):
            problems.append(f"{' + '.join(f'sft.{k}' for k in SFT_FLAWS)} = {flaws:.3g}: a demonstration has at most "
                            "one flaw, so the shares must sum to <= 1")
        return problems


@dataclasses.dataclass(frozen=True)
class RLSettings(Section):
    """GRPO: the batch and its groups, the loss, the old log-probs, the reward and the information signal."""
    key = "rl"
    batch_questions: int = setting(256, "B: questions per GRPO step")
    group_size: int = setting(5, "G: samples of each question, the group its advantage compares")
    optimizer_steps: int = setting(2, "optimizer steps (mini-batches) per training step")
    micro_batch_size: int = setting(8, "rows per micro-batch of the update (their gradients summed)")
    logprob_batch_size: int = setting(32, "rows per forward pass scoring old and reference log-probs")
    shuffle_rows: bool = setting(True, "shuffle the rows before the mini-batches (the recipe does not; "
                                       "docs/method.md §2)")
    aggregation: str = setting("token_mean", 'how rows weigh in the loss: "token_mean", "trajectory_mean", '
                                             '"trajectory_row_mean" or "microbatch_token_mean" (the recipe\'s; '
                                             "docs/method.md §2)")
    clip_low: float = setting(0.2, "the ratio's lower bound is 1 - clip_low")
    clip_high: float = setting(0.2, "the ratio's upper bound is 1 + clip_high")
    dual_clip: float = setting(3.0, "for a negative advantage A the per-token surrogate is capped at -A x dual_clip")
    kl_coef: float = setting(0.001, "weight of the KL term to the initial policy (0: no reference is kept)")
    kl_estimator: str = setting("low_var_kl", 'k3 (docs/method.md §2); "k1" and "k2" also registered')
    kl_clamp: float = setting(10.0, "the per-token KL is clamped to [-kl_clamp, kl_clamp]")
    log_ratio_clamp: float = setting(20.0, "log-ratios are clamped to [-log_ratio_clamp, log_ratio_clamp] before exp")
    entropy_coef: float = setting(0.001, "weight of the entropy bonus")
    filter_groups: str = setting("none", '"zero_std": drop groups whose rewards all tie and refill from new questions '
                                         "(filtered_groups, refill_rounds logged)")
    max_refill: int = setting(2, "refill rounds per step under filter_groups=zero_std")
    reward_fn: str = setting("", '"module:function" or "file.py:function" with qa_metrics.compute_reward\'s '
                                 'signature ("": the MemSearcher reward, docs/method.md §3)')
    logits_chunk: int = setting(0, "the loss's logits this many positions at a time, recomputed in backward (0: all)")
    tis_cap: float = setting(0.0, "truncated importance sampling: weight = min(exp(trainer - sampler log-prob), cap) "
                                  "(0: off)")
    min_seq_len: int = setting(1024, "the trainer's rows pad to quarter-octave buckets from here")
    max_seq_len: int = setting(32768, "a conversation longer than this stops the step with an error")
    pack_rows: bool = setting(True, "pack a step's conversations first-fit into shared rows (segments): the same "
                                    "loss and gradients, less padding (pad_frac_unpacked / pad_frac_packed logged)")
    old_logprobs: str = setting("recompute", '"recompute": a trainer pass over every row (verl\'s); "sampler": the '
                                             "rollout's own (needs sampler.cache_dtype = model.dtype)")
    old_logprobs_max_gap: float = setting(0.01, 'old_logprobs="sampler": the largest |trainer - sampler| log-prob of '
                                                "a sampled token a step accepts, else it recomputes")
    max_staleness: int = setting(0, "K > 0: steps t+1..t+K are rolled out with older weights while step t learns, "
                                    'each trajectory at most K steps stale (needs old_logprobs="sampler"; '
                                    "rl/async_rollout.py); 0: rollout, then update, in turn")
    info_signal: str = setting("off", '"log": score log p(gold | each turn\'s carried context) after the rollout '
                                      '(info/* metrics); "reward": also shape the advantage (rl/information.py)')
    info_coef: float = setting(0.0, 'info_signal="reward": weight of the group-normalised information gain')
    coverage_coef: float = setting(0.0, "added to a trajectory's reward x the share of its questions a search named "
                                         "(0: the reward alone; rl/grpo.py:with_coverage)")

    def problems(self, training: bool = True) -> list[str]:
        """Batch sizes, groups, refills, old log-probs, the reward and the information signal."""
        problems = [f"rl.{key} must be >= 1, got {self[key]}" for key in
                    ("batch_questions", "optimizer_steps", "micro_batch_size", "logprob_batch_size") if self[key] < 1]
        if training and self.group_size < 2:  # evaluation samples one episode a question: no groups
            problems.append(f"rl.group_size={self.group_size}: GRPO's advantage compares the samples of a question "
                            "with each other, so it needs >= 2 (a group of one never learns)")
        trajectories = self.batch_questions * self.group_size
        if self.optimizer_steps > trajectories >= 1:
            problems.append(f"rl.optimizer_steps={self.optimizer_steps} is more than a step's {trajectories} "
                            "trajectories (rl.batch_questions * rl.group_size): some mini-batches would be empty; "
                            f"set rl.optimizer_steps <= {trajectories}")
        if self.filter_groups not in ("none", "zero_std"):
            problems.append(f"rl.filter_groups must be 'none' or 'zero_std', got {self.filter_groups!r}")
        if self.max_refill < 0:
            problems.append(f"rl.max_refill must be >= 0, got {self.max_refill}")
        if self.old_logprobs not in ("recompute", "sampler"):
            problems.append(f"rl.old_logprobs must be 'recompute' or 'sampler', got {self.old_logprobs!r}")
        if self.max_staleness < 0:
            problems.append(f"rl.max_staleness must be >= 0 (0: no rollout ahead of the learner), got "
                            f"{self.max_staleness}")
        elif self.max_staleness > 0 and self.old_logprobs != "sampler":
            # The ratio and clip must be taken against the policy that sampled, K versions back.
            problems.append(f"rl.max_staleness={self.max_staleness} needs rl.old_logprobs='sampler' (the ratio and "
                            f"clip against the weights that sampled), got {self.old_logprobs!r}")
        try:
            load_reward_fn(self.reward_fn)
        except TrainConfigError as e:
            problems.append(str(e))
        if not (math.isfinite(self.coverage_coef) and self.coverage_coef >= 0):
            problems.append(f"rl.coverage_coef must be a finite number >= 0 (0: off), got {self.coverage_coef!r}")
        return problems + info_problems(self.info_signal, self.info_coef)


@dataclasses.dataclass(frozen=True)
class OptimSettings(Section):
    """AdamW after global-norm clipping; its own checks are rl/learner.py's OptimConfig's."""
    key = "optim"
    learning_rate: float = setting(1e-6, "the peak learning rate (the recipe's, for a pretrained 3B model)")
    b1: float = setting(0.9, "AdamW's beta1")
    b2: float = setting(0.999, "AdamW's beta2")
    weight_decay: float = setting(0.01, "AdamW's weight decay")
    max_grad_norm: float = setting(1.0, "gradients are clipped to this global norm")
    schedule: str = setting("constant", '"constant" (the recipe) or "cosine" (to final_lr_fraction at the last '
                                        "optimizer step)")
    warmup_steps: int = setting(0, "linear warm-up over this many optimizer steps")
    final_lr_fraction: float = setting(0.1, "cosine: the learning rate at the last step, as a fraction of the peak")


@dataclasses.dataclass(frozen=True)
class TrainSettings(Section):
    """The run: its length, seed, directory, checkpoints, evaluation and logging."""
    key = "train"
    steps: int = setting(1000, "GRPO steps")
    seed: int = setting(0, "the run's seed (the warm start, the question order, the samples)")
    output_dir: str = setting("runs/default", "the run's directory: checkpoints, logs, its export (local, or gs:// "
                                              "through etils.epath: TensorBoard events only for a local one)")
    save_every: int = setting(20, "steps between checkpoints")
    keep: int = setting(3, "checkpoints kept")
    eval_questions: int = setting(0, "held-out questions scored before and after GRPO (0: skip)")
    eval_per_set: int = setting(200, "instead: the first N questions of every evaluation set (Search-R1's limit)")
    eval_every: int = setting(50, "steps between held-out evaluations during GRPO (0: none); the best params by "
                                  "eval/em are kept in OUTPUT/best/")
    log_samples_every: int = setting(0, "steps between sample trajectories logged as text (TensorBoard text and "
                                        "logs/samples.jsonl; 0: none)")
    samples_per_log: int = setting(4, "trajectories in each of those logs")
    wandb_project: str = setting("", 'also log to Weights & Biases ("": off; WANDB_MODE=offline works)')
    compilation_cache_dir: str = setting("~/.cache/memsearcher-jax/xla-cache", "JAX's persistent compilation cache "
                                         '("": off; $MEMSEARCHER_JAX_COMPILATION_CACHE overrides)')

    def problems(self, training: bool = True) -> list[str]:
        """The run's length, cadences and counts (the cache directory against this machine: config_rules)."""
        problems = []
        if self.steps < 0:
            problems.append(f"train.steps must be >= 0, got {self.steps}")
        if self.save_every < 1 or self.keep < 1:
            problems.append("train.save_every and train.keep must be >= 1")
        return problems + [f"train.{key} must be >= 0, got {self[key]}" for key in
                           ("eval_every", "eval_questions", "eval_per_set", "log_samples_every") if self[key] < 0]


def info_problems(signal, coef) -> list[str]:
    """rl.info_signal and rl.info_coef (rl/information.py): a known mode, a finite coefficient >= 0
    that only "reward" reads, one host (each host would score its own rows in another count of calls)."""
    import jax

    from memsearcher_jax.rl.information import INFO_MODES  # the learner's package loads JAX

    if signal not in INFO_MODES:
        return [f"rl.info_signal must be one of {', '.join(map(repr, INFO_MODES))}, got {signal!r}"]
    if not isinstance(coef, (int, float)) or not math.isfinite(coef) or coef < 0:
        return [f"rl.info_coef must be a finite number >= 0 (0: the signal shapes nothing), got {coef!r}"]
    if coef and signal != "reward":
        return [f"rl.info_coef={coef} shapes the advantage only with rl.info_signal='reward', got {signal!r}; "
                "set rl.info_signal='reward' or rl.info_coef=0"]
    if signal != "off" and jax.process_count() > 1:
        return [f"rl.info_signal={signal!r} runs on one host only; this job has {jax.process_count()}: set 'off'"]
    return []


def load_reward_fn(spec: str) -> Callable:
    """`rl.reward_fn`: "" for the MemSearcher reward, else "module:function" or
    "path/to/file.py:function", a callable with `compute_reward`'s signature
    (blocks, ended_with_eos, golds) -> RewardResult."""
    from memsearcher_jax.qa_metrics import compute_reward

    if not spec:
        return compute_reward
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise TrainConfigError(f"rl.reward_fn={spec!r}: expected 'module:function' or 'file.py:function'")
    try:
        if where.endswith(".py"):
            loader = importlib.util.spec_from_file_location(f"_reward_{abs(hash(where))}", os.path.expanduser(where))
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except (ImportError, FileNotFoundError, SyntaxError) as e:
        raise TrainConfigError(f"rl.reward_fn={spec!r}: cannot load {where!r}: {e}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise TrainConfigError(f"rl.reward_fn={spec!r}: {where!r} has no callable {name!r}")
    return fn
