"""Resume rules owned by the learner (issue 82): a resumed run may re-batch the same computation,
but under rl.aggregation=microbatch_token_mean the micro-batch size sets the loss weights."""
from __future__ import annotations

import os

import pytest

from memsearcher_jax.errors import UserInputError
from memsearcher_jax.rules.run_dir import check_same_experiment, record_config
from memsearcher_jax.settings.config_utils import load_config

DEFAULT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "default.py")


@pytest.mark.parametrize("aggregation, refused", [("microbatch_token_mean", True), ("token_mean", False),
                                                  ("trajectory_mean", False)])
def test_resume_refuses_a_new_micro_batch_size_only_where_it_weighs_the_loss(tmp_path, aggregation, refused):
    out = str(tmp_path / "run")
    record_config(load_config(DEFAULT, [("rl.aggregation", aggregation), ("rl.micro_batch_size", "8")]), out)
    os.makedirs(os.path.join(out, "checkpoints", "2"))  # a checkpoint: an experiment to protect
    resumed = load_config(DEFAULT, [("rl.aggregation", aggregation), ("rl.micro_batch_size", "4")])
    if refused:
        with pytest.raises(UserInputError, match=r"rl\.micro_batch_size 8 -> 4"):
            check_same_experiment(resumed, out)
    else:
        check_same_experiment(resumed, out)  # the same gradient, batched otherwise
    # The logprob passes' batching never weighs anything: free under every aggregation.
    check_same_experiment(load_config(DEFAULT, [("rl.aggregation", aggregation), ("rl.micro_batch_size", "8"),
                                                ("rl.logprob_batch_size", "4")]), out)
