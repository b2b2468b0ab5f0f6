"""Pretraining the reading base: `memsearcher-jax pretrain --config configs/base_v8.py`.

Real GRPO runs start from a pretrained model that can already read; ours is tiny and trained here.
The files, in the order a run uses them:

- `phases.py`: the config's phase list (`cfg.phases`: each phase's start, mix, lengths, batch size,
  learning rate), resolved, validated and recorded for the manifest; the learning-rate schedule;
- `curriculum.py`: the training rows (repeat, recall, cloze, long, bind, multi, demo) from random worlds;
- `model_init.py`: the initial model (mimetic attention, positional heads, tied name rows);
- `batches.py`: a step's batch, on a thread or in worker processes;
- `probes.py`: the reading probes on reserved names, and their scoring;
- `checks.py`: what a run refuses before any work;
- `run.py`: the run (resumable) and reading a checkpoint (`--probe-step`);
- `export.py`: the Hugging Face export and its base_manifest.json.
"""
from memsearcher_jax.pretrain.checks import check_base_export_dir, check_vocab_settings, validate_pretrain
from memsearcher_jax.pretrain.export import BASE_MANIFEST, export_base, machine_facts, read_history
from memsearcher_jax.pretrain.phases import Phase, decay_steps, optim_config, phase_list, phase_records
from memsearcher_jax.pretrain.probes import (
    SIDE_SETS,
    base_probe,
    final_probe,
    final_probe_sets,
    pair_hits,
    pair_probe,
    probe_builder,
    probe_items,
    probe_sets,
    probe_table,
    reading_probe,
    unpack_hits,
)
from memsearcher_jax.pretrain.run import checkpoint_model, probe_checkpoint, run_pretrain

__all__ = [
    "BASE_MANIFEST", "SIDE_SETS", "Phase", "base_probe", "check_base_export_dir", "check_vocab_settings",
    "checkpoint_model", "decay_steps", "export_base", "final_probe", "final_probe_sets", "machine_facts",
    "optim_config", "pair_hits", "pair_probe", "phase_list", "phase_records", "probe_builder", "probe_checkpoint",
    "probe_items", "probe_sets", "probe_table", "read_history", "reading_probe", "run_pretrain", "unpack_hits",
    "validate_pretrain",
]
