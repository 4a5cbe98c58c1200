"""The training loop: any algorithm's draft against a frozen verifier.

:func:`fit` runs the objective of the draft's algorithm (:meth:`specfmt.algorithms.base.Training.loss`:
EAGLE-3's training-time test, EAGLE-1's feature regression, Medusa's self-distillation) with
Muon on the draft's matrices and AdamW (0.9, 0.95) on the rest, or AdamW throughout
(:mod:`specfmt.training.optim`, ``--optimizer``), linear warmup and then cosine decay to 10 % or linear decay to 0
(``--schedule``, :func:`learning_rate`), gradients clipped at 0.5, batches
from :class:`specfmt.training.data.Windows` (a function of the step, so ``--resume`` continues
bit for bit), the verifier's features computed on the fly or read from a
:class:`specfmt.training.data.FeatureCache`, and several processes through ``torch.distributed``
(``torchrun``; the objective is wrapped in ``DistributedDataParallel``). The figures are all-position top-1
agreement with the in-vocabulary agreement and the draft vocabulary's coverage beside it
(:class:`~specfmt.algorithms.base.LossFigures`, :class:`PositionFigures`); held-out windows, when given, are
evaluated during training and the best evaluation's weights kept (:func:`evaluate`, :class:`Evaluation`).
"""

from __future__ import annotations

import gc
import math
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .. import interrupt
from ..algorithms import get
from ..algorithms.base import AlgorithmOptions, LossFigures
from ..errors import InputError, TrainInterrupted
from . import data
from .hsdata import HiddenStateBatches
from .optim import build_optimizer

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ..algorithms.base import Training
    from .data import FeatureCache, HeldOut, Windows
    from .hsdata import HiddenStateHeldOut


@dataclass
class TrainStats:
    """Figures of one training run.

    Attributes:
        steps: optimizer steps.
        tokens: positions trained on (batch x window per step, all steps).
        seconds: wall time.
        loss: mean loss of the last 50 steps (every step of a shorter run: ``recent_steps``).
        accuracy: per draft position (EAGLE-3 TTT step, Medusa head; EAGLE-1 has one), the all-position
            top-1 agreement: the share of every prediction under the loss mask whose top draft token is the
            verifier's top-1 (last 50 steps, all ranks; :class:`~specfmt.algorithms.base.LossFigures`).
        conditional_accuracy: per position, the same share among the predictions whose verifier top-1 is in
            the draft vocabulary (equal to ``accuracy`` for a draft without one).
        coverage: per position, the share of counted predictions whose verifier top-1 is in the draft
            vocabulary (1.0 without one).
        resumed_from: the step a resumed run started at (0: from the start).
        evaluations: the held-out evaluations, in step order (:class:`Evaluation`; empty without a held-out split).
        kept: the evaluation whose weights the draft holds at the end (the best by estimated acceptance
            length, or the last with ``keep_last``); None without a held-out split.
    """

    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0
    loss: float = float("nan")
    accuracy: list[float] = field(default_factory=list)
    resumed_from: int = 0
    conditional_accuracy: list[float] = field(default_factory=list)
    coverage: list[float] = field(default_factory=list)
    evaluations: list["Evaluation"] = field(default_factory=list)
    kept: "Evaluation | None" = None
    #: the steps ``loss`` and the agreement figures are the mean of: the last 50, or every step of a shorter run
    recent_steps: int = 0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def estimated_acceptance_length(self) -> float:
        """``1 + a1 + a1·a2 + ...`` from the per-position top-1 agreement: a rough running estimate."""
        return acceptance_estimate(self.accuracy)


class PositionFigures(list):
    """The per-position all-position top-1 agreement of one step (a list of floats, what ``fit``'s ``log``
    callback receives), with the conditional agreement and the draft vocabulary's coverage beside it.

    Attributes:
        conditional: per position, the agreement among the predictions whose verifier top-1 is in the draft vocabulary.
        coverage: per position, the share of counted predictions whose verifier top-1 is in the draft vocabulary.
    """

    conditional: list[float]
    coverage: list[float]

    @classmethod
    def of(cls, correct: list[int], counted: list[int], cond_correct: list[int], cond_counted: list[int]) -> "PositionFigures":
        """From the counts (summed over steps or processes); a position with nothing counted reads 0."""
        f = cls(a / max(b, 1) for a, b in zip(correct, counted))
        f.conditional = [a / max(b, 1) for a, b in zip(cond_correct, cond_counted)]
        f.coverage = [a / max(b, 1) for a, b in zip(cond_counted, counted)]
        return f


@dataclass
class Evaluation:
    """One evaluation of the draft on the held-out windows (no gradients).

    Attributes:
        step: optimizer steps done when it ran.
        loss: the objective's mean loss over the held-out batches.
        accuracy: per position, the all-position top-1 agreement (as :attr:`TrainStats.accuracy`).
        conditional_accuracy: per position, among in-vocabulary predictions.
        coverage: per position, the draft vocabulary's coverage of the verifier's top-1.
    """

    step: int
    loss: float
    accuracy: list[float]
    conditional_accuracy: list[float]
    coverage: list[float]

    @property
    def estimated_acceptance_length(self) -> float:
        """:func:`acceptance_estimate` of :attr:`accuracy`."""
        return acceptance_estimate(self.accuracy)

    def to_json(self) -> dict[str, Any]:
        """The figures rounded to 4 places, as the provenance records them."""
        return {"step": self.step, "loss": round(self.loss, 4), "top1_agreement": [round(a, 4) for a in self.accuracy],
                "top1_agreement_conditional": [round(a, 4) for a in self.conditional_accuracy],
                "draft_vocab_coverage": [round(a, 4) for a in self.coverage],
                "estimated_acceptance_length": round(self.estimated_acceptance_length, 4)}


def warmup_cosine(step: int, steps: int, warmup: int, peak: float) -> float:
    """Learning rate at ``step`` (0-based) of ``steps``: linear warmup over ``warmup`` steps to
    ``peak``, then cosine decay to 10 % of ``peak``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def warmup_linear(step: int, steps: int, warmup: int, peak: float) -> float:
    """Learning rate at ``step`` (0-based) of ``steps``: linear warmup over ``warmup`` steps to ``peak``, then linear
    decay to 0 at ``steps``: speculators 0.9's default scheduler (``--scheduler-type linear``, transformers'
    ``get_linear_schedule_with_warmup``, ``speculators/train/trainer.py``), except that the first warmup step takes
    ``peak / warmup`` (as in :func:`warmup_cosine`) where transformers' takes 0."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * max(0.0, (steps - step) / max(1, steps - warmup))


#: ``--schedule``: the decay after the warmup, and the warmup's default share of ``--steps`` as a divisor (linear: 1 %,
#: speculators 0.9's ``_resolve_scheduler_steps`` in ``speculators/train/trainer.py``; cosine: 5 %)
SCHEDULES: dict[str, tuple[Callable[[int, int, int, float], float], int]] = {"cosine": (warmup_cosine, 20), "linear": (warmup_linear, 100)}


def learning_rate(step: int, opts: "TrainOptions") -> float:
    """The rate of ``step`` (0-based) under ``opts``' schedule, warmup and peak ``lr`` (resolved options,
    :meth:`TrainOptions.resolved`)."""
    return SCHEDULES[opts.schedule or DEFAULT_SCHEDULE][0](step, opts.steps, opts.warmup_steps(), opts.lr)


def acceptance_estimate(accuracy: list[float]) -> float:
    """``1 + a1 + a1·a2 + ...``: the mean acceptance length if position j were accepted with
    probability a_j once every earlier one was (a rough guide, not a measurement)."""
    total, run = 1.0, 1.0
    for a in accuracy:
        run *= a
        total += run
    return total


#: the peak learning rate, optimizer and schedule of an algorithm that names none of its own (:meth:`TrainOptions.resolved`)
DEFAULT_LR, DEFAULT_OPTIMIZER, DEFAULT_SCHEDULE = 1e-3, "adamw", "cosine"


@dataclass
class TrainOptions:
    """The shared hyper-parameters of :func:`fit` (the ``specfmt train`` flags every algorithm has; an
    algorithm's own options are its :class:`~specfmt.algorithms.base.AlgorithmOptions`).

    Attributes:
        steps: optimizer steps.
        batch_size: windows per step and process (B).
        seq_len: tokens per window (T).
        lr: peak learning rate (both optimizer groups); None: the algorithm's
            (:attr:`~specfmt.algorithms.base.Training.train_defaults`, else :data:`DEFAULT_LR`; :meth:`resolved`).
        optimizer: ``muon`` (Muon on the 2-D weight matrices, AdamW on the rest) or ``adamw``
            (:func:`specfmt.training.optim.build_optimizer`); None: the algorithm's, else :data:`DEFAULT_OPTIMIZER`.
        schedule: the rate after the warmup, a key of :data:`SCHEDULES`: ``cosine`` (to 10 % of ``lr``) or ``linear``
            (to 0, speculators' default); None: the algorithm's, else :data:`DEFAULT_SCHEDULE`.
        warmup: warmup steps (None: 5 % of ``steps`` with ``cosine``, 1 % with ``linear``; at least 1).
        seed: seeds the windows, the noise and a new draft's initialisation.
        save_every: steps between saved training states (0: only at the end or on Ctrl-C).
        heldout: share of the data set aside and evaluated during training (None: the pipeline's default,
            :func:`specfmt.training.pipeline.heldout_share`; 0: no split).
        eval_every: steps between held-out evaluations (None: a tenth of ``steps``, at least 1); one also runs at the end.
        keep_last: write the last weights, not the best held-out evaluation's.
    """

    steps: int = 500
    batch_size: int = 8
    seq_len: int = 256
    lr: float | None = None
    optimizer: str | None = None
    schedule: str | None = None
    warmup: int | None = None
    seed: int = 0
    save_every: int = 100
    heldout: float | None = None
    eval_every: int | None = None
    keep_last: bool = False

    def resolved(self, algorithm: str) -> "TrainOptions":
        """These options with ``lr``, ``optimizer`` and ``schedule`` not given taken from ``algorithm``'s training part
        (:attr:`~specfmt.algorithms.base.Training.train_defaults`: the values a benchmark chose for it), else
        :data:`DEFAULT_LR`, :data:`DEFAULT_OPTIMIZER` and :data:`DEFAULT_SCHEDULE`; an algorithm specfmt does not know
        takes those."""
        from ..algorithms import REGISTRY

        found = REGISTRY.get(algorithm)
        own = found.training.train_defaults if found is not None and found.training is not None else {}
        return replace(self, lr=self.lr if self.lr is not None else own.get("lr", DEFAULT_LR),
                       optimizer=self.optimizer if self.optimizer is not None else own.get("optimizer", DEFAULT_OPTIMIZER),
                       schedule=self.schedule if self.schedule is not None else own.get("schedule", DEFAULT_SCHEDULE))

    def eval_interval(self) -> int:
        return self.eval_every if self.eval_every is not None else max(1, self.steps // 10)

    def warmup_steps(self) -> int:
        return self.warmup if self.warmup is not None else max(1, self.steps // SCHEDULES[self.schedule or DEFAULT_SCHEDULE][1])


STATE_FILE = "state.pt"


def global_normaliser(counts: "torch.Tensor") -> "torch.Tensor":
    """What a process divides its sums of per-position losses by: the count over every process (all-reduced,
    at least 1) over the number of processes.

    ``DistributedDataParallel`` averages the processes' gradients, so each process's ``sum / (N / W)``
    averages to ``(sum over all processes) / N``, the mean over every counted position -- the loss of one
    process on the whole global batch. Dividing by the process's own count instead (a mean of means)
    weighs a position by how many its own process counted: wrong wherever processes count different
    numbers of positions (EAGLE-3 with a draft vocabulary masks the positions whose verifier token is
    outside it). Called by every process at the same point of every step (a collective).

    Args:
        counts: [n] float64, this process's counted positions per loss term, on its device.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return counts.clamp(min=1)
    total = counts.clone()
    dist.all_reduce(total)
    return total.clamp(min=1) / dist.get_world_size()


def _objective(algo: "Training", draft: Any, embed: Any, head: Any, opts: TrainOptions, options: AlgorithmOptions,
               subset: list[int] | None) -> Any:
    """The loss of one batch as an ``nn.Module`` (what ``DistributedDataParallel`` wraps), normalised over every
    process's counted positions (:func:`global_normaliser`)."""
    import torch
    from torch import nn

    class Objective(nn.Module):
        def __init__(self):
            super().__init__()
            self.draft = draft
            self._frozen = (embed, head)  # a tuple: not registered, never synchronised or trained

        def forward(self, ids, aux, last, step: int, mask=None):
            embed, head = self._frozen
            g = torch.Generator().manual_seed(opts.seed * 7919 + step)  # the step's noise (EAGLE-1)
            masked = {"loss_mask": mask} if mask is not None else {}
            r = LossFigures.of(algo.loss(self.draft, embed=embed, head=head, ids=ids, aux=aux, last=last, options=options, generator=g,
                                         subset=subset, normaliser=global_normaliser, **masked))
            return r[0], r[1], r[2], r.cond_correct, r.cond_counted  # a plain tuple through DistributedDataParallel

    return Objective()


@dataclass
class _Run:
    """What the steps of one :func:`fit` share."""

    model: Any
    draft: Any
    opt: Any
    params: list[Any]
    device: Any
    taps: list[int]
    positions: int
    rank: int
    world: int
    state_path: Path | None
    fingerprint: dict[str, Any]
    objective: Any = None
    recent: list[tuple[float, list[int], list[int], list[int], list[int]]] = field(default_factory=list)
    best: dict[str, Any] | None = None


def fit(
    algorithm: str,
    draft: Any,
    verifier: Any,
    windows: "Windows",
    opts: TrainOptions,
    *,
    options: AlgorithmOptions | None = None,
    embed: "torch.Tensor | None" = None,
    cache: "FeatureCache | None" = None,
    state_dir: str | Path | None = None,
    resume: bool = False,
    fingerprint: dict[str, Any] | None = None,
    subset: list[int] | None = None,
    log: Callable[[int, float, list[float]], None] | None = None,
    autocast: Any = None,
    heldout: "HeldOut | HiddenStateHeldOut | None" = None,
    evaluated: Callable[[Evaluation], None] | None = None,
) -> TrainStats:
    """Train ``draft`` in place against the frozen ``verifier``.

    Args:
        algorithm: the draft's algorithm (``speculators_model_type``).
        draft: its module (:meth:`specfmt.algorithms.base.Reference.module`), on the verifier's
            device; only its parameters with ``requires_grad`` are trained.
        verifier: a transformers causal LM, eval mode, no gradients.
        windows: :class:`specfmt.training.data.Windows` (this process's rank and world size), or
            :class:`specfmt.training.hsdata.HiddenStateBatches`: the features and loss mask read from
            hidden-states data (``verifier`` then needs only its two ends, :class:`~specfmt.training.data.FrozenEnds`).
        opts: :class:`TrainOptions`.
        options: the algorithm's own options (its :attr:`~specfmt.algorithms.base.Training.train_options`;
            None: their defaults), handed to its objective.
        embed: [V, H] the embedding the draft reads (default: the verifier's).
        cache: a complete :class:`specfmt.training.data.FeatureCache` for ``windows`` (which
            must then be fixed), or None to run the verifier every step.
        state_dir: where the training state (weights, optimizer, step) is saved every
            ``opts.save_every`` steps and on Ctrl-C; None: never.
        resume: continue from the state in ``state_dir``.
        fingerprint: what the run is (options, data, verifier); a resumed state must match.
        subset: the parts the objective trains (Medusa heads; :meth:`~specfmt.algorithms.base.Training.heads_trained`), None for all.
        log: called on the main process as ``log(step, loss, accuracy_per_position)`` after every step (a :class:`PositionFigures`).
        autocast: a 16-bit torch dtype (the verifier's, ``torch.bfloat16``): the draft's forward and
            loss run under ``torch.autocast(device_type, autocast)`` while its weights, gradients and
            AdamW state stay float32 (mixed precision with float32 master weights, as EAGLE's own
            trainer runs: ``accelerate launch --mixed_precision=bf16``, SafeAILab/EAGLE ``scripts/train_*.sh``;
            SpecForge's FSDP ``MixedPrecision`` computes in bf16 too); None: float32 throughout.
        heldout: the held-out windows or samples (:class:`~specfmt.training.data.HeldOut`, :class:`~specfmt.training.hsdata.HiddenStateHeldOut`),
            evaluated every ``opts.eval_interval()`` steps and at the end (:func:`evaluate`); the draft ends with the best evaluation's weights
            by estimated acceptance length (``opts.keep_last``: the last), kept in the training state. None: no evaluation. ``evaluated``: called with each.

    Returns:
        :class:`TrainStats` (figures summed over processes).

    Raises:
        InputError: ``resume`` without a saved state, or a state of another run; the algorithm cannot be trained.
        TrainInterrupted: Ctrl-C; the state of the last finished step was saved.
    """
    algo = get(algorithm).training
    if algo is None:
        raise InputError(f"{algorithm} drafts cannot be trained by this specfmt")
    options = options if options is not None else algo.train_options()
    run = _start(algo, draft, verifier, opts := opts.resolved(algorithm), options, embed, subset, state_dir, fingerprint)
    stats = TrainStats()
    stats.resumed_from = _resume(run) if resume else 0
    verifier.eval()
    draft.train()
    t0 = time.perf_counter()
    try:
        _steps(run, stats, verifier, windows, cache, opts, log, autocast, (heldout, evaluated))
    finally:
        if run.world > 1:
            # DistributedDataParallel's reducer hangs on the draft's parameters (its autograd hooks) and outlives this
            # call; one destroyed at the interpreter's exit, with gloo's work objects, aborts the process now and then
            # ("terminate called without an active exception", SIGABRT: pytorch/pytorch#179291). It goes here.
            run.model = None
            gc.collect()
    stats.seconds = time.perf_counter() - t0
    _finish(run, stats, opts)
    draft.eval()
    return stats


def _finish(run: _Run, stats: TrainStats, opts: TrainOptions) -> None:
    """The last 50 steps' figures into ``stats``; the best evaluation's weights into the draft (unless ``keep_last``)."""
    if run.recent:
        stats.recent_steps = len(run.recent)
        stats.loss = sum(r[0] for r in run.recent) / len(run.recent)
        sums = [[sum(r[k][s] for r in run.recent) for s in range(run.positions)] for k in range(1, 5)]
        f = PositionFigures.of(*sums)
        stats.accuracy, stats.conditional_accuracy, stats.coverage = list(f), f.conditional, f.coverage
    if run.best is not None:
        stats.evaluations = [Evaluation(**e) for e in run.best["history"]]
        stats.kept = stats.evaluations[-1] if opts.keep_last else Evaluation(**run.best["figures"])
        if not opts.keep_last:
            run.draft.load_state_dict(run.best["draft"])


def _steps(run: "_Run", stats: TrainStats, verifier: Any, windows: "Windows", cache: "FeatureCache | None", opts: TrainOptions,
           log: Callable[[int, float, list[float]], None] | None, autocast: Any, held: tuple[Any, Any] = (None, None)) -> None:
    """The steps from ``stats.resumed_from`` to ``opts.steps``, the state saved every ``opts.save_every`` steps and at the end.

    Raises:
        TrainInterrupted: Ctrl-C; the state of the last finished step was saved.
    """
    done = stats.resumed_from
    try:
        for step in range(stats.resumed_from, opts.steps):
            loss, c, n, cc, cn, tokens = _step(run, verifier, windows, cache, opts, step, autocast)
            run.recent = (run.recent + [(loss, c, n, cc, cn)])[-50:]
            stats.steps += 1
            stats.tokens += tokens
            done = step + 1
            if log and run.rank == 0:
                log(step, loss, PositionFigures.of(c, n, cc, cn))
            if held[0] is not None and (done % opts.eval_interval() == 0 or done == opts.steps):
                _keep(run, evaluate(run, verifier, held[0], done, autocast), held[1])
            if opts.save_every and done % opts.save_every == 0 and done < opts.steps:
                _save(run, done)
    except KeyboardInterrupt:
        with interrupt.finishing():  # the watchdog waits for the state to be saved (specfmt.interrupt)
            _save(run, done)
        raise TrainInterrupted(f"interrupted after step {done} of {opts.steps}",
                               hint=f"the state is saved in {run.state_path.parent}; continue with the same command and --resume" if run.state_path else None) from None
    _save(run, done)


def _start(algo: "Training", draft: Any, verifier: Any, opts: TrainOptions, options: AlgorithmOptions, embed: Any, subset: list[int] | None,
           state_dir: str | Path | None, fingerprint: dict[str, Any] | None) -> _Run:
    """The objective (wrapped in ``DistributedDataParallel`` under torchrun), its optimizer and what the steps share."""
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized()
    opts = opts.resolved(algo.name)
    device = next(draft.parameters()).device
    head = verifier.get_output_embeddings()
    embed = (embed if embed is not None else verifier.get_input_embeddings().weight).detach().to(device)
    model = obj = _objective(algo, draft, embed, head, opts, options, subset)
    if distributed:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(obj, device_ids=[device.index] if device.type == "cuda" else None)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = build_optimizer(draft, opts.optimizer, opts.lr)
    return _Run(model, draft, opt, params, device, algo.feature_taps(draft.cfg), algo.train_positions(draft, options),
                dist.get_rank() if distributed else 0, dist.get_world_size() if distributed else 1,
                Path(state_dir) / STATE_FILE if state_dir else None, fingerprint or {}, objective=obj)


def _resume(run: _Run) -> int:
    """Load the saved state into the run; the step it continues at.

    Raises:
        InputError: no saved state, or a state of another run (its fingerprint differs).
    """
    import torch

    if run.state_path is None or not run.state_path.is_file():
        raise InputError(f"--resume: no saved training state at {run.state_path}", hint="run without --resume to start from step 0")
    state = torch.load(run.state_path, map_location=run.device, weights_only=True)
    if state.get("fingerprint") != run.fingerprint:
        old = state.get("fingerprint") or {}
        diff = sorted(k for k in set(old) | set(run.fingerprint) if old.get(k) != run.fingerprint.get(k))
        raise InputError(f"the saved state at {run.state_path} is of another run (differs in: {', '.join(diff)})",
                         hint="resume with the same options, or start over without --resume")
    run.draft.load_state_dict(state["draft"])
    run.opt.load_state_dict(state["optimizer"])
    run.recent = [(float(r[0]), list(r[1]), list(r[2]), list(r[3 if len(r) > 3 else 1]), list(r[4 if len(r) > 3 else 2]))
                  for r in state["recent"]]
    run.best = state.get("best")
    return int(state["step"])


def _save(run: _Run, step: int) -> None:
    """Save the training state after ``step`` steps (process 0; written aside, then moved into place)."""
    import torch

    if run.state_path is None or run.rank != 0:
        return
    run.state_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = run.state_path.with_suffix(".tmp")
    saved = {"step": step, "draft": run.draft.state_dict(), "optimizer": run.opt.state_dict(), "recent": run.recent,
             "fingerprint": run.fingerprint}
    if run.best is not None:
        saved["best"] = run.best
    torch.save(saved, tmp)
    os.replace(tmp, run.state_path)


def evaluate(run: _Run, verifier: Any, heldout: "HeldOut | HiddenStateHeldOut", step: int, autocast: Any = None) -> Evaluation:
    """The objective on the held-out windows without gradients (:class:`~specfmt.training.data.HeldOut`: fixed windows,
    in order, their features computed or read from the cache; :class:`~specfmt.training.hsdata.HiddenStateHeldOut`: held-out
    samples read from hidden-states data, each with its loss mask); the draft's weights are untouched. Every process runs
    the same windows (no collective but the objective's normaliser), so every process reaches the same figures and
    keeps the same weights.

    Returns:
        :class:`Evaluation` at ``step``: the mean of the batches' losses, the figures over all the windows' predictions.
    """
    import torch

    losses, sums = [], [[0] * run.positions for _ in range(4)]
    run.draft.eval()
    with torch.no_grad(), torch.autocast(run.device.type, dtype=autocast, enabled=autocast is not None):
        for ids, aux, last, *mask in heldout.batches(verifier, run.taps, run.device):  # hidden-states data: with its loss mask
            loss, *counts = run.objective(ids, aux, last, 0, *mask)
            losses.append(float(loss))
            sums = [[a + b for a, b in zip(s, c)] for s, c in zip(sums, counts)]
    run.draft.train()
    f = PositionFigures.of(*sums)
    return Evaluation(step, sum(losses) / len(losses), list(f), f.conditional, f.coverage)


def _keep(run: _Run, e: Evaluation, evaluated: Callable[[Evaluation], None] | None) -> None:
    """Record the evaluation; keep a copy of the weights when it is the best so far by estimated acceptance length."""
    from dataclasses import asdict

    best = run.best
    history = (best["history"] if best else []) + [asdict(e)]
    if best is None or e.estimated_acceptance_length > Evaluation(**best["figures"]).estimated_acceptance_length:
        best = {"figures": asdict(e), "draft": {k: v.detach().clone() for k, v in run.draft.state_dict().items()}}
    run.best = {**best, "history": history}
    if evaluated is not None and run.rank == 0:
        evaluated(e)


def _step(run: _Run, verifier: Any, windows: "Windows", cache: "FeatureCache | None", opts: TrainOptions, step: int,
          autocast: Any) -> tuple[float, list[int], list[int], list[int], list[int], int]:
    """One optimizer step: ``(loss, correct, counted, conditional correct, conditional counted, tokens)``, the figures
    per position, summed over processes."""
    import torch
    import torch.distributed as dist

    mask = None
    if isinstance(windows, HiddenStateBatches):  # features read from hidden-states data, with its loss mask
        ids, aux, last, mask = (t.to(run.device) if t is not None else None for t in windows.batch_at(step))
    elif cache is not None:
        ids = windows.ids(step).to(run.device)
        aux, last = cache.get([i for _, i in windows.indices(step)])
        aux, last = (aux.to(run.device) if aux is not None else None), last.to(run.device)
    else:
        ids = windows.ids(step).to(run.device)
        aux, last = data.verifier_features(verifier, ids, run.taps)
    for g in run.opt.param_groups:
        g["lr"] = learning_rate(step, opts)
    with torch.autocast(run.device.type, dtype=autocast, enabled=autocast is not None):
        loss, correct, counted, cond_correct, cond_counted = run.model(ids, aux, last, step, mask)
    run.opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(run.params, 0.5)
    run.opt.step()
    figures = torch.tensor([loss.item(), *correct, *counted, *cond_correct, *cond_counted], dtype=torch.float64)
    if run.world > 1:  # NCCL reduces device tensors only
        figures = figures.to(run.device)
        dist.all_reduce(figures)
        figures = figures.cpu()
        figures[0] /= run.world
    p = run.positions
    counts = [[int(x) for x in figures[1 + k * p:1 + (k + 1) * p]] for k in range(4)]
    return float(figures[0]), *counts, ids.numel() * run.world


__all__ = ["DEFAULT_LR", "DEFAULT_OPTIMIZER", "DEFAULT_SCHEDULE", "SCHEDULES", "STATE_FILE", "Evaluation", "PositionFigures", "TrainOptions", "TrainStats", "acceptance_estimate", "evaluate", "fit",
           "global_normaliser", "learning_rate", "warmup_cosine", "warmup_linear"]
