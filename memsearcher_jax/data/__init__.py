"""Data: the synthetic world (synthetic, tokenizer, world_cache) and the paper's QA sets (qa,
tfds_builders). Import the submodules directly; tfds_builders pulls in tensorflow-datasets."""
