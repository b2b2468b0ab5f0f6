"""The planner's rollout rows against a real Sampler call on this machine's devices.

    python bench/plan_check.py --config configs/recipe.py:qwen2_5_3b,h100_8 --rows 8 \
        --config.mesh.fsdp=1 --config.mesh.tp=1 --config.hardware.num_devices=1

See memsearcher_jax/app/plan_check.py. Exit status 1 when a row plans less than 0.8x of what the
devices hold (an over-estimate is reported, not failed).
"""
import sys

from memsearcher_jax.app.plan_check import main

if __name__ == "__main__":
    sys.exit(main())
