"""bench/studies/warmup_determinism.py's comparison of two loss trajectories and its weight digest."""

from __future__ import annotations

import torch

from bench.studies.warmup_determinism import first_difference, weights_digest


def test_first_difference_names_the_first_step_that_parts_and_the_widest_gap_after_it():
    a = [5.0, 4.0, 3.0, 2.5, 2.0]
    b = [5.0, 4.0, 3.25, 2.0, 2.125]
    assert first_difference(a, b) == {"step": 2, "loss_a": 3.0, "loss_b": 3.25, "max_gap_after": 0.5}
    assert first_difference(a, list(a)) is None
    # A shorter trajectory is compared over the steps both have.
    assert first_difference(a, a[:3]) is None
    assert first_difference([1.0, 2.0], [1.0, 2.0 + 2**-20])["step"] == 1


def test_weights_digest_sees_the_last_bit_of_any_parameter():
    model = torch.nn.Linear(3, 2)
    before = weights_digest(model)
    assert weights_digest(model) == before
    with torch.no_grad():
        w = model.weight.view(-1)
        w[4] = torch.nextafter(w[4], torch.tensor(float("inf")))
    assert weights_digest(model) != before
