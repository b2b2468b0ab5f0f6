"""What a training run logs: per-step metrics and sample trajectories.

    writer = MetricsWriter(out_dir / "logs", resume_step=step, wandb_project="")
    writer.write(step, metrics)                 # metrics.jsonl + TensorBoard (+ W&B)
    writer.write_samples(step, samples)         # samples.jsonl + TensorBoard text (+ W&B table)

Paths go through etils.epath, so an output directory may be local or `gs://...`. TensorBoard
event files are written for local directories (tensorboardX cannot write to object stores
without TensorFlow); metrics.jsonl and samples.jsonl are written wherever the run writes.
"""
from __future__ import annotations

import json
import os
import re
import sys

import numpy as np
from etils import epath

from memsearcher_jax.agent.rollout import Trajectory
from memsearcher_jax.rl.advantages import zero_variance_fraction
from memsearcher_jax.rl.token_metrics import by_turn_metrics, prompt_tokens_by_turn, trajectory_token_metrics

LOG_DIR = "logs"  # a run's MetricsWriter directory, in its output directory
LOG_FILES = {"metrics": "metrics.jsonl", "samples": "samples.jsonl"}
# What a MetricsWriter writes in its directory (run_dir.py's list of a run's files reads this): its
# JSONL files (one with `.tmp`: a rewrite that was killed), TensorBoard's event files, W&B's folder.
_WRITTEN = re.compile("(" + "|".join(re.escape(n) for n in LOG_FILES.values())
                      + r")(\.tmp)?$|events\.out\.tfevents\.|wandb$")


def is_log_file(name: str) -> bool:
    """Whether `name`, in a MetricsWriter's directory, is something the writer (or its libraries) wrote."""
    return bool(_WRITTEN.match(name))


def rollout_metrics(trajs: list[Trajectory], results, num_rows: int) -> dict:
    rewards = np.array([r.reward for r in results])
    groups = np.array([t.group_id for t in trajs])
    ctx = [c for t in trajs for c in t.context_tokens]
    mem = [n for t in trajs for n in t.memory_tokens]
    return {
        "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
        "em": float(np.mean([r.em for r in results])), "f1": float(np.mean([r.f1 for r in results])),
        "format_error_rate": float(np.mean([not r.format_ok for r in results])),
        "zero_variance_groups": float(zero_variance_fraction(rewards, groups)),
        "turns_per_trajectory": float(np.mean([t.turns for t in trajs])),  # act calls (react: 1 conversation)
        "searches_per_trajectory": float(np.mean([t.num_searches for t in trajs])),
        "memory_tokens_mean": float(np.mean(mem)) if mem else 0.0,
        "context_tokens_mean": float(np.mean(ctx)) if ctx else 0.0,
        "context_tokens_max": float(np.max(ctx)) if ctx else 0.0,
        "response_tokens_mean": float(np.mean([len(c.response_ids) for t in trajs for c in t.conversations])),
        "rows": int(num_rows),
        # the context each workflow pays per question, and per act call by turn (token_metrics)
        **{k: v for k, v in trajectory_token_metrics(trajs).items() if k in ("peak_tokens", "tokens_per_question")},
        **by_turn_metrics(prompt_tokens_by_turn([t.act_prompt_tokens for t in trajs])),
    }


def sample_records(trajs: list[Trajectory], results, decode, n: int) -> list[dict]:
    """The first n trajectories as text: question, golds, answer, reward, how it ended, and every
    conversation decoded (`decode`: ids -> text)."""
    return [{"question": t.question, "golds": t.golds, "answer": r.answer, "reward": r.reward,
             "end_reason": t.end_reason, "memories": t.memories,
             "conversations": [decode(c.prompt_ids + c.response_ids) for c in t.conversations]}
            for t, r in list(zip(trajs, results))[:n]]


def _is_link(path: epath.Path) -> bool:
    return "://" not in str(path) and os.path.islink(path)


def _rewrite(path: epath.Path, text: str) -> None:
    """`text` written beside `path` and renamed over it: a symlink in its place is replaced by the
    file, never written through (the file it points at is left as it was)."""
    tmp = path.parent / (path.name + ".tmp")
    if "://" not in str(path) and os.path.lexists(tmp):
        os.remove(tmp)  # a killed rewrite's (or a link): the new one is made, not written through
    tmp.write_text(text)
    tmp.replace(path)


def _truncate_jsonl(path: epath.Path, resume_step: int) -> None:
    """Drop lines logged past resume_step by a run that died, so every step appears once (from
    step 0: every line)."""
    if path.exists() or _is_link(path):
        lines = path.read_text().splitlines() if resume_step and path.exists() else []
        _rewrite(path, "".join(line + "\n" for line in lines if line and json.loads(line)["step"] <= resume_step))


class MetricsWriter:
    """metrics.jsonl and samples.jsonl, TensorBoard scalars and text, optionally Weights & Biases."""

    def __init__(self, log_dir: str, resume_step: int = 0, wandb_project: str = "", run_name: str = ""):
        """resume_step: the step a resumed run restarts after; lines logged past it by the run
        that died are dropped (TensorBoard purges them too), so every step is logged once.
        wandb_project: log there too ("" = off); W&B's offline mode (WANDB_MODE=offline) needs no
        network; without the wandb package a message says so and the run goes on."""
        self.dir = epath.Path(log_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.paths = {name: self.dir / file for name, file in LOG_FILES.items()}
        for path in self.paths.values():
            _truncate_jsonl(path, resume_step)
        self.tb = None
        if not str(log_dir).startswith(("gs://", "s3://")):
            try:
                from tensorboardX import SummaryWriter  # optional: metrics.jsonl is always written

                self.tb = SummaryWriter(str(log_dir), purge_step=resume_step + 1 if resume_step else None)
            except ImportError:
                pass
        self.wandb = None
        if wandb_project:
            try:
                import wandb  # optional dependency
            except ImportError:
                print("memsearcher-jax: train.wandb_project is set but wandb is not installed "
                      "(pip install wandb); logging to TensorBoard and JSONL only", file=sys.stderr)
            else:
                self.wandb = wandb.init(project=wandb_project, name=run_name or None, dir=str(self.dir),
                                        resume="allow")

    def _append(self, name: str, record: dict) -> None:
        """One line at the end of the file. A local file is never appended through a symlink: a link
        put in its place is replaced by a file of the lines it showed, then appended to."""
        path, line = self.paths[name], json.dumps(record) + "\n"
        if "://" in str(path):
            with path.open("a") as f:  # remote: an object store has no links
                f.write(line)
            return
        if _is_link(path):
            _rewrite(path, path.read_text() if path.exists() else "")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)  # a new link: refused
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(line)

    def write(self, step: int, metrics: dict):
        scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and np.isfinite(v)}
        self._append("metrics", {"step": step, **scalars})
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def write_samples(self, step: int, samples: list[dict]):
        self._append("samples", {"step": step, "samples": samples})
        text = "\n\n---\n\n".join(
            f"**Q:** {s['question']}  **gold:** {s['golds']}  **answer:** {s['answer']}  "
            f"**reward:** {s['reward']:.2f}  **ended:** {s['end_reason']}\n\n" +
            "\n\n".join(f"```\n{c}\n```" for c in s["conversations"]) for s in samples)
        if self.tb is not None:
            self.tb.add_text("samples", text, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log({"samples": text}, step=step)

    def close(self):
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
