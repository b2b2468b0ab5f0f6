"""The process's machinery, below the learner: hosts and meshes (`distributed.py`), the compile
counter and JAX's cache (`compile_stats.py`), the jobs' log line (`console.py`), JSON Lines files
(`jsonl.py`). Imports only models and errors."""
