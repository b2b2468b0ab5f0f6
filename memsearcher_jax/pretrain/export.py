"""The export of a finished run: a bf16 Hugging Face directory and its base_manifest.json (the
command, the config, every phase, the final probe, the history, every file's size and sha256)."""
from __future__ import annotations

import hashlib
import os
import platform
import shlex
import sys
import time

import jax
import ml_collections
from safetensors import safe_open

from memsearcher_jax.models import Qwen2, save_pretrained
from memsearcher_jax.pretrain.phases import phase_records
from memsearcher_jax.pretrain.probes import FINAL_SEED, base_probe, final_probe, pair_probe
from memsearcher_jax.rules.run_dir import write_json
from memsearcher_jax.runtime.jsonl import read_jsonl_if_exists

BASE_MANIFEST = "base_manifest.json"


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_history(log_dir: str) -> list[dict]:
    """(step, loss, probe accuracy) of every logged step, for the manifest."""
    rows = read_jsonl_if_exists(os.path.join(log_dir, "metrics.jsonl"))
    keys = {"probe": "probe_accuracy", "probe_all_lengths": "probe_all_lengths", "probe_multi": "probe_multi",
            "probe_worst_relation": "probe_worst_relation"}
    out, last = [], 0
    for r in rows:
        out.append({"step": r["step"], "loss": round(r["loss"], 4),
                    **{k: round(r[m], 4) for k, m in keys.items() if m in r}})
        if r.get("steps_per_second"):  # wall time of the interval, its probe and any compile included
            out[-1]["seconds"] = round((r["step"] - last) / r["steps_per_second"], 1)
        last = r["step"]
    return out


def machine_facts() -> dict:
    """What the export ran on (the run's machine when it ran on one kind): CPU, cores, memory, devices."""
    cpu, mem = platform.processor() or platform.machine(), None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
        with open("/proc/meminfo", encoding="utf-8") as f:
            kb = next((int(line.split()[1]) for line in f if line.startswith("MemTotal")), 0)
            mem = round(kb / 2 ** 20, 1)
    except OSError:
        pass
    devices = jax.devices()
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem, "platform": platform.platform(),
            "jax_devices": f"{len(devices)} x {devices[0].device_kind}"}


def export_base(model: Qwen2, vocab_dir: str, out_dir: str, cfg: ml_collections.ConfigDict,
                argv: list[str] | None = None, seed: int = 0, n_probe: int = 512, history: list | None = None) -> dict:
    """bf16 Hugging Face directory + base_manifest.json (command, config, every phase, the final
    probe measured on the stored bf16 weights (`reading_probe`), the progress probe's 2-passage
    figure, binding pairs by relation (`pair_probe`), every file's size and sha256, tensor shapes).
    Returns the final probe."""
    save_pretrained(model, out_dir, tokenizer_dir=vocab_dir, dtype="bfloat16")
    probe = final_probe(out_dir, n_probe, seed)
    files = {}
    for name in sorted(os.listdir(out_dir)):
        if name == BASE_MANIFEST:
            continue
        path = os.path.join(out_dir, name)
        files[name] = {"bytes": os.path.getsize(path), "sha256": _sha256(path)}
    with safe_open(os.path.join(out_dir, "model.safetensors"), "np") as f:
        tensors = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    manifest = {
        "command": "memsearcher-jax pretrain " + " ".join(shlex.quote(a) for a in (argv or sys.argv[2:])),
        "date": time.strftime("%Y-%m-%d"),
        "seed": {"vocab": cfg.vocab.seed, "init": cfg.model.init_seed, "data": cfg.train.seed},
        "config": cfg.to_dict(),
        "phases": phase_records(cfg),
        "reading_probe": probe,
        "progress_probe": base_probe(out_dir, n_probe, seed),
        # Binding per relation, on pairs no final or progress set draws from (seeds apart).
        "pair_probe": pair_probe(out_dir, max(1, n_probe // 2), seed=seed + FINAL_SEED + 97),
        "history": history or [],
        # Wall time summed over the logged intervals (steps lost to an interruption not counted).
        "pretraining": {"seconds": round(sum(h.get("seconds", 0) for h in history or []), 1),
                        "machine": machine_facts()},
        "tensors": tensors,
        "files": files,
    }
    write_json(os.path.join(out_dir, BASE_MANIFEST), manifest, indent=1, default=list)  # never through a link
    return probe
