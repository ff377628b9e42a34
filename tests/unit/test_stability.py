"""The stability grid: every (LR, cumulative interventions) cell trained on the same batches, with its instruments."""

import numpy as np
import pytest

from infra.errors import DataError
from tasks.stability.experiment import COLUMNS, StabilityExperimentConfig, run_grid
from tasks.train.data import MixtureSampler

CFG = StabilityExperimentConfig(lrs=[0.003, 0.05], interventions=["bare", "warmup", "qk_norm"], steps=20,
                                batch_size=4, seq_len=32, warmup_steps=3, probe_every=2,
                                model={"n_layers": 2, "d_model": 32, "n_heads": 4, "n_kv_heads": 4, "d_ff": 64})


def sampler(seed):
    tokens = np.tile(np.arange(128, dtype=np.uint16), 40)
    return MixtureSampler({"a": tokens}, {"a": 1.0}, seq_len=32, batch_size=4, seed=seed)


def test_grid_has_one_row_per_cell_with_cumulative_names():
    table = run_grid(CFG, sampler, vocab_size=128, seed=0)
    assert list(table.columns) == COLUMNS
    assert list(zip(table["lr"], table["interventions"])) == [
        (0.003, "bare"), (0.003, "warmup"), (0.003, "warmup+qk_norm"),
        (0.05, "bare"), (0.05, "warmup"), (0.05, "warmup+qk_norm")]
    assert (table["steps_done"] == 20).all() and not table["diverged"].any()
    assert (table["max_attention_logit"] > 0).all() and (table["max_grad_norm"] > 0).all()
    assert table["final_ce"].between(0, np.log(128) + 1).all()


def test_same_seed_same_table():
    small = CFG.model_copy(update={"lrs": [0.01], "interventions": ["bare", "clipping"]})
    a, b = run_grid(small, sampler, 128, 0), run_grid(small, sampler, 128, 0)
    assert a.equals(b)


def test_grid_must_start_bare():
    with pytest.raises(DataError, match="bare"):
        run_grid(CFG.model_copy(update={"interventions": ["warmup", "bare"]}), sampler, 128, 0)
