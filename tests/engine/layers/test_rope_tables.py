"""RoPE's cos/sin tables grow as steps reach new positions, in fixed blocks: a position's values are the
same however far, and in whatever order, the table grew; and the table holds only what was reached."""

from __future__ import annotations

import torch

from engine.layers.rope import BLOCK_POSITIONS, Rope

CPU = torch.device("cpu")


def test_a_positions_rows_do_not_depend_on_how_the_table_grew() -> None:
    far = torch.tensor([2 * BLOCK_POSITIONS + 17])
    near = torch.tensor([3, 40, BLOCK_POSITIONS - 1])
    forward, backward = Rope(64, 500000.0, 131072, CPU), Rope(64, 500000.0, 131072, CPU)
    a_near, a_far = forward.tables(near), forward.tables(far)
    b_far, b_near = backward.tables(far), backward.tables(near)
    for got, want in ((a_near, b_near), (a_far, b_far)):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # the values are the rotation's: cos(p * f) for each position p and frequency f
    p = float(far[0])
    assert torch.allclose(a_far[0][0, 0, :32], torch.cos(p * forward.inv_freq.double()).float(), atol=2e-3)


def test_the_table_holds_only_the_blocks_reached() -> None:
    rope = Rope(128, 500000.0, 131072, CPU)
    assert rope.cos.shape[0] == 0
    rope.tables(torch.tensor([0, 100]))
    assert rope.cos.shape == (BLOCK_POSITIONS, 128)
    rope.tables(torch.tensor([BLOCK_POSITIONS]))
    assert rope.cos.shape == (2 * BLOCK_POSITIONS, 128)
    short = Rope(64, 10000.0, 100, CPU)
    short.tables(torch.tensor([99]))
    assert short.cos.shape == (100, 64)  # never past the context
