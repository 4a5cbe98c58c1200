"""Issue 38: ``--schedule cosine|linear``: the rate after the warmup, each algorithm's default, and the refusal.

``linear`` is speculators 0.9's default scheduler (``--scheduler-type linear``: transformers'
``get_linear_schedule_with_warmup`` over ``--max-steps``, warmup 1 %, ``speculators/train/trainer.py``); it is checked
against transformers' own function here.
"""

from __future__ import annotations

import pytest
import torch
from conftest import WORLD
from transformers import get_linear_schedule_with_warmup

from specfmt.errors import InputError
from specfmt.training.loop import DEFAULT_SCHEDULE, TrainOptions, learning_rate, warmup_cosine, warmup_linear


def test_linear_is_transformers_linear_schedule_after_the_first_step():
    """Step by step transformers' rate (its ``LambdaLR`` stepped after each optimizer step, as speculators' trainer
    steps it) equals ours but for the warmup, where ours is one step ahead (its first step takes rate 0)."""
    steps, warmup, peak = 300, 3, 3e-2
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    sched = get_linear_schedule_with_warmup(opt, warmup, steps)
    theirs = []
    for _ in range(steps):
        theirs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    ours = [warmup_linear(s, steps, warmup, peak) for s in range(steps)]
    assert theirs[0] == 0.0 and ours[:warmup] == pytest.approx(theirs[1:warmup + 1])
    assert ours[warmup:] == pytest.approx(theirs[warmup:], rel=1e-12, abs=1e-15)
    assert ours[warmup - 1] == peak and ours[-1] == pytest.approx(peak / (steps - warmup))


def test_each_algorithm_takes_its_schedule_and_the_warmup_follows_it():
    """EAGLE-3 trains with the linear schedule (the benchmark's winner, ``tests/test_trainer_bench.py``), warmup 1 %
    of the steps; an algorithm without its own takes cosine, warmup 5 %; a given schedule or warmup wins."""
    eagle3 = TrainOptions(steps=1500).resolved("eagle3")
    assert (eagle3.schedule, eagle3.warmup_steps()) == ("linear", 15)
    assert [learning_rate(s, eagle3) for s in (0, 14, 1499)] == pytest.approx([eagle3.lr / 15, eagle3.lr, eagle3.lr / 1485], rel=1e-12)
    medusa = TrainOptions(steps=1500).resolved("medusa")
    assert (medusa.schedule, medusa.warmup_steps()) == (DEFAULT_SCHEDULE, 75) == ("cosine", 75)
    assert learning_rate(1499, medusa) == warmup_cosine(1499, 1500, 75, medusa.lr) == pytest.approx(0.1 * medusa.lr, rel=1e-4)
    given = TrainOptions(steps=1500, schedule="cosine", warmup=7).resolved("eagle3")
    assert (given.schedule, given.warmup_steps()) == ("cosine", 7)
    assert TrainOptions(steps=50).resolved("eagle3").warmup_steps() == 1  # at least one step


def test_an_unknown_schedule_is_one_line_before_anything_is_read(tmp_path):
    from specfmt.training.pipeline import TrainRequest, train_draft

    req = TrainRequest(out=str(tmp_path / "o"), verifier=str(WORLD / "verifier"), algorithm="eagle3", data=["nowhere.txt"])
    with pytest.raises(InputError, match="--schedule must be cosine or linear, not 'step'") as e:
        train_draft(req, TrainOptions(schedule="step"))
    assert "\n" not in str(e.value) and not (tmp_path / "o").exists()
