"""The learning curve of a run, as a text table and a PNG (no TensorBoard needed).

Both read `logs/metrics.jsonl` of a training output directory (one JSON line per step, kept
whole across resumes), so they show the whole run whatever was resumed.
"""
from __future__ import annotations

import os

from memsearcher_jax.runtime.jsonl import read_jsonl_if_exists

CURVES = (("reward_mean", "training reward"), ("em", "training EM"), ("turns_per_trajectory", "turns per trajectory"))


def read_metrics(out_dir: str) -> list[dict]:
    return read_jsonl_if_exists(os.path.join(out_dir, "logs", "metrics.jsonl"))


def curve_table(metrics: list[dict], rows: int = 10) -> str:
    """About `rows` evenly spaced steps (first and last included): reward, EM, turns, searches."""
    if not metrics:
        return "(no training steps logged)"
    n, k = len(metrics), min(rows, len(metrics))
    picks = sorted({round(i * (n - 1) / max(k - 1, 1)) for i in range(k)})
    lines = [f"{'step':>5}{'reward':>9}{'EM':>7}{'turns':>7}{'searches':>10}{'format err':>12}"]
    for i in picks:
        m = metrics[i]
        lines.append(f"{m['step']:>5}{m.get('reward_mean', 0):>9.3f}{100 * m.get('em', 0):>7.1f}"
                     f"{m.get('turns_per_trajectory', 0):>7.2f}{m.get('searches_per_trajectory', 0):>10.2f}"
                     f"{100 * m.get('format_error_rate', 0):>11.1f}%")
    return "\n".join(lines)


def plot_curves(metrics: list[dict], png_path: str, em_before: float | None = None,
                em_after: float | None = None) -> str | None:
    """Training reward, EM and turns per trajectory by step (held-out EM before/after as marks)."""
    if not metrics:
        return None
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in metrics]
    fig, axes = plt.subplots(1, len(CURVES), figsize=(4 * len(CURVES), 3.2))
    for ax, (key, title) in zip(axes, CURVES):
        scale = 100 if key == "em" else 1
        ax.plot(steps, [scale * m.get(key, float("nan")) for m in metrics], marker=".", label="training")
        if key == "em":
            for value, label, style in ((em_before, "held-out before", "--"), (em_after, "held-out after", "-")):
                if value is not None:
                    ax.axhline(100 * value, linestyle=style, color="black", linewidth=1, label=label)
            ax.set_ylabel("%")
            ax.legend(fontsize=7)
        ax.set_title(title)
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path


def plot_prompt_tokens_by_turn(by_workflow: dict, png_path: str, title: str = "") -> str | None:
    """Prompt tokens per act call by turn, one line per workflow (mean solid, max dotted).

    by_workflow: workflow name -> its `token_metrics.prompt_tokens_by_turn` rows (objects with
    turn, mean and max, or dicts with those keys). The paper's picture: a memory workflow stays
    flat, ReAct grows every turn."""
    lines = {name: [r if isinstance(r, dict) else vars(r) for r in rows] for name, rows in by_workflow.items() if rows}
    if not lines:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for k, (name, rows) in enumerate(lines.items()):
        color = f"C{k}"
        turns = [r["turn"] for r in rows]
        ax.plot(turns, [r["mean"] for r in rows], marker="o", color=color, label=f"{name} (mean)")
        ax.plot(turns, [r["max"] for r in rows], linestyle=":", color=color, label=f"{name} (max)")
    ax.set_xlabel("turn")
    ax.set_ylabel("prompt tokens per act call")
    ax.set_title(title or "context per turn")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path
