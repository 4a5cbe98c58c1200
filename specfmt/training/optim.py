"""The optimizers of ``specfmt train`` (``--optimizer``): AdamW throughout, or Muon for the draft's matrices.

``adamw``: one ``torch.optim.AdamW`` over every trained parameter, betas (0.9, 0.95), no weight decay.

``muon``: ``torch.optim.Muon`` (torch >= 2.9; Keller Jordan's Newton-Schulz orthogonalised momentum,
https://kellerjordan.github.io/posts/muon/; :class:`specfmt.training.muon.Muon`, whose bf16 products run in float32
on a CPU, 11-40 times faster there: ``benchmarks/muon_cpu.py``) over the 2-D weight matrices, and the AdamW above
over the rest: norms, biases, embeddings and the output head. The split is speculators 0.9's
(``speculators/train/optimizers.py``, ``split_named_params_for_muon``): a trained parameter goes to Muon iff it is
2-D with both sides > 1 and its name holds none of ``embed_tokens``, ``lm_head``, ``codebook``, ``markov_w1``,
``markov_w2``. Muon's settings are speculators' defaults (``build_optimizers``; ``speculators/train/config/schema.py``
``OptimizerArgs``): momentum 0.95 (Nesterov, torch's default), weight decay 0.1, 5 Newton-Schulz steps and the
``match_rms_adamw`` rate adjustment (update scaled by ``0.2 * sqrt(max(A, B))``, Moonshot's rule, so that one learning
rate serves both groups); both groups take the same scheduled rate, as speculators' ``muon_lr`` defaults to ``lr``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: the values of ``--optimizer``
OPTIMIZERS = ("muon", "adamw")
#: 2-D parameters that stay with AdamW, by a part of their name (speculators/train/optimizers.py ``_ADAMW_NAME_HINTS``:
#: embeddings, embedding-like codebooks, vocabulary factors and output heads, as Keller Jordan's Muon excludes them)
ADAMW_NAME_HINTS = ("embed_tokens", "lm_head", "codebook", "markov_w1", "markov_w2")
#: AdamW's settings (both modes)
ADAMW_BETAS, ADAMW_WEIGHT_DECAY = (0.9, 0.95), 0.0
#: Muon's settings (speculators 0.9's defaults: ``OptimizerArgs.muon_momentum``, ``muon_weight_decay``, ``muon_ns_steps``,
#: ``muon_adjust_lr_fn``)
MUON_MOMENTUM, MUON_WEIGHT_DECAY, MUON_NS_STEPS, MUON_ADJUST_LR = 0.95, 0.1, 5, "match_rms_adamw"


def goes_to_muon(name: str, shape: tuple[int, ...]) -> bool:
    """Whether a trained parameter ``name`` of ``shape`` goes to Muon: 2-D, both sides > 1, and no
    :data:`ADAMW_NAME_HINTS` entry in its name (speculators/train/optimizers.py ``split_named_params_for_muon``)."""
    return len(shape) == 2 and min(shape) > 1 and not any(h in name for h in ADAMW_NAME_HINTS)


def split_for_muon(module: "torch.nn.Module") -> tuple[list[tuple[str, "torch.Tensor"]], list[tuple[str, "torch.Tensor"]]]:
    """The trained parameters of ``module`` as ``(muon, adamw)`` lists of ``(name, parameter)``, in the module's order.

    A parameter with ``requires_grad`` goes to Muon iff ``ndim == 2``, ``min(shape) > 1`` and no
    :data:`ADAMW_NAME_HINTS` entry is part of its name; every other trained parameter goes to AdamW
    (speculators/train/optimizers.py ``split_named_params_for_muon``). Frozen parameters are in neither.
    """
    muon, adamw = [], []
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        if goes_to_muon(name, tuple(p.shape)):
            muon.append((name, p))
        else:
            adamw.append((name, p))
    return muon, adamw


class Optimizers:
    """Several ``torch.optim`` optimizers stepped as one: what :func:`specfmt.training.loop.fit` drives.

    Attributes:
        optimizers: the optimizers, in order (``muon``: ``[Muon, AdamW]``, either left out when it has no parameter).
    """

    def __init__(self, optimizers: list["torch.optim.Optimizer"]):
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Every optimizer's parameter groups (the loop sets each group's scheduled ``lr``)."""
        return [g for o in self.optimizers for g in o.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for o in self.optimizers:
            o.step()

    def state_dict(self) -> dict[str, Any]:
        """``{"optimizers": [each optimizer's state_dict()], "kinds": [their class names]}``."""
        return {"optimizers": [o.state_dict() for o in self.optimizers], "kinds": [type(o).__name__ for o in self.optimizers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load what :meth:`state_dict` gave.

        Raises:
            ValueError: a state of other optimizers (a resumed run's fingerprint records ``--optimizer``, so
                :func:`specfmt.training.loop.fit` refuses such a state before this).
        """
        kinds = [type(o).__name__ for o in self.optimizers]
        if state.get("kinds") != kinds:
            raise ValueError(f"a saved state of optimizers {state.get('kinds')}, not {kinds}")
        for o, s in zip(self.optimizers, state["optimizers"]):
            o.load_state_dict(s)


def build_optimizer(module: "torch.nn.Module", kind: str, lr: float) -> Optimizers:
    """The optimizer of ``kind`` (:data:`OPTIMIZERS`) over the trained parameters of ``module``, at rate ``lr``.

    Raises:
        ValueError: an unknown ``kind``, or no trained parameter.
    """
    import torch

    if kind not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {kind!r}; one of {', '.join(OPTIMIZERS)}")
    muon, adamw = split_for_muon(module) if kind == "muon" else ([], [(n, p) for n, p in module.named_parameters() if p.requires_grad])
    if not muon and not adamw:
        raise ValueError("no trained parameter to optimize")
    found: list[torch.optim.Optimizer] = []
    if muon:
        from specfmt.training.muon import Muon

        found.append(Muon([p for _, p in muon], lr=lr, momentum=MUON_MOMENTUM, weight_decay=MUON_WEIGHT_DECAY,
                          ns_steps=MUON_NS_STEPS, adjust_lr_fn=MUON_ADJUST_LR))
    if adamw:
        found.append(torch.optim.AdamW([p for _, p in adamw], lr=lr, betas=ADAMW_BETAS, weight_decay=ADAMW_WEIGHT_DECAY))
    return Optimizers(found)


__all__ = ["ADAMW_NAME_HINTS", "OPTIMIZERS", "Optimizers", "build_optimizer", "goes_to_muon", "split_for_muon"]
