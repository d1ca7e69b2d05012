"""noaux_tc routing kernel: ids equal to the reference's (ties included), weights close, validation."""

import pytest
import torch

from kernels.harness import format_table, run_spec
from kernels.routing import SPEC_TRITON, noaux_tc, noaux_tc_ref
from tests.kernels.interpreter import DEVICES


@pytest.mark.parametrize("device", DEVICES)
def test_routing_spec_passes(device):
    rows = run_spec(SPEC_TRITON, device)
    assert rows and all(r.passed for r in rows), format_table(rows)


def test_all_equal_scores_pick_the_lowest_ids_deterministically(device):
    logits, bias = torch.zeros(2, 64, device=device), torch.zeros(64, device=device)
    w, ids = noaux_tc(logits, bias, 6, 8, 3)
    assert ids.tolist() == [[0, 1, 2, 3, 4, 5]] * 2
    torch.testing.assert_close(w, torch.full((2, 6), 1 / 6, device=device))
    assert torch.equal(noaux_tc(logits, bias, 6, 8, 3)[1], ids)


def test_bias_chooses_but_does_not_weight(device):
    logits = torch.zeros(1, 16, device=device)
    bias = torch.zeros(16, device=device)
    bias[9] = 5.0  # expert 9 wins selection on bias alone
    w, ids = noaux_tc(logits, bias, 2, 4, 2, norm_topk_prob=False, routed_scaling_factor=1.0)
    assert ids[0, 0] == 9
    torch.testing.assert_close(w[0, 0], torch.tensor(0.5, device=device))  # sigmoid(0), not sigmoid(0) + 5


def test_dropped_groups_stay_dropped_with_negative_scores(device):
    """Kept groups all score below zero; a 0-filled mask would let a dropped group's expert in."""
    logits = torch.full((1, 8), -10.0, device=device)
    bias = torch.tensor([-1.0, -1.0, -0.5, -0.5, -3.0, -3.0, -3.0, -3.0], device=device)
    _, ids = noaux_tc(logits, bias, 3, 4, 2)
    _, rids = noaux_tc_ref(logits, bias, 3, 4, 2)
    assert torch.equal(ids, rids)
    assert set(ids[0].tolist()) <= {0, 1, 2, 3}


def test_bad_config_is_named(device):
    with pytest.raises(ValueError, match="n_group=3 must divide"):
        noaux_tc(torch.zeros(1, 16, device=device), torch.zeros(16, device=device), 2, 3, 1)
    with pytest.raises(ValueError, match="e_score_correction_bias"):
        noaux_tc(torch.zeros(1, 16, device=device), torch.zeros(8, device=device), 2, 4, 1)
