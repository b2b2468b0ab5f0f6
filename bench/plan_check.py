"""The planner's rollout rows against a real Sampler call on this machine's devices.

    python bench/plan_check.py --config configs/recipe_qwen2_5_3b_h100_8.py --rows 8 \
        --config.mesh.fsdp=1 --config.mesh.tp=1 --config.hardware.num_devices=1

See memsearcher_jax/plan_check.py. Exit status 1 when a row plans less than 0.8x of what the
devices hold (an over-estimate is reported, not failed).
"""
import os
import sys

# bench/retrieval.py would shadow the top-level `retrieval` package: take bench/ off the path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

from memsearcher_jax.plan_check import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
