"""P-EAGLE (parallel EAGLE): an EAGLE-3 draft that proposes its k tokens in one pass.

The draft is EAGLE-3's (:mod:`.eagle3`: ``fc`` over n_aux taps, decoder layers, a draft vocabulary)
plus ``mask_hidden`` [1, 1, n_aux·H_t], the tap states of a position not yet drafted, and a mask
token (``mask_token_id``). After the verified positions (as EAGLE-3 reads them), the k-1 positions
that follow read the mask token's embedding and ``combine(mask_hidden)``, causally; position j of
that pass proposes the token j+2 ahead, so one pass gives k tokens, none fed back.

Sources: speculators 0.9 ``models/peagle/config.py`` (``PEagleSpeculatorConfig(Eagle3SpeculatorConfig)``:
``mask_token_id``; ``architectures`` ``["PEagleSpeculator"]``), ``models/peagle/core.py``
(``PEagleDraftModel``: ``mask_hidden``, the mask token at depth > 0) and ``attention.py``
(``create_peagle_mask_mod``: depth-d positions see the anchor's context and the depths before d);
vLLM 0.32 ``transformers_utils/configs/speculators/algos.py::update_peagle`` (``mask_token_id`` ->
``pard_token``; ``PeagleLlamaForCausalLM`` / ``PeagleQwen3ForCausalLM``), ``speculators/base.py``
(``peagle`` -> method ``eagle3`` with ``parallel_drafting``), ``v1/spec_decode/llm_base_proposer.py``
(k-1 extra slots of ``pard_token``, hidden ``combine_hidden_states(mask_hidden)``) and
``model_executor/models/llama_eagle3.py`` (``mask_hidden`` loaded only with ``parallel_drafting``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from ..format.config import register_config
from ..format.model import NonNegativeInt
from ..format.tensors import TensorSpec
from . import layers
from .base import Proposer, Variant, register
from .eagle3 import CAUSES as EAGLE3_CAUSES, Eagle3, Eagle3Config, _Eagle3Chain

if TYPE_CHECKING:  # pragma: no cover
    import torch


@register_config
class PEagleConfig(Eagle3Config):
    """A P-EAGLE ``config.json`` (speculators ``PEagleSpeculatorConfig``; vLLM ``algos.update_peagle``):
    EAGLE-3's fields and rules, and the mask token. Notation as :class:`~specfmt.algorithms.eagle3.Eagle3Config`."""

    name: ClassVar[str] = "peagle"
    architecture: ClassVar[str] = "PEagleSpeculator"
    schema_description: ClassVar[str] = (
        "P-EAGLE: EAGLE-3 drafting its k tokens in one pass (speculators models/peagle). Fields read by vLLM's algos.update_peagle.")

    mask_token_id: NonNegativeInt = Field(description=(
        "The token the k-1 positions drafted in parallel read (speculators mask_token_id; vLLM's pard_token). "
        "vLLM reads config_dict['mask_token_id'] unconditionally, so it is required."))

    def violations(self) -> list[tuple[str, str]]:
        """EAGLE-3's rules, and ``mask_token_id`` < V (its embedding row is read from the V-row table)."""
        out = super().violations()
        if self.mask_token_id >= self.vocab_size:
            out.append(("$.mask_token_id", f"{self.mask_token_id} is outside the verifier vocabulary transformer_layer_config.vocab_size={self.vocab_size}"))
        return out


#: the misreadings of a P-EAGLE checkpoint: EAGLE-3's, and two of its own
CAUSES = {
    **EAGLE3_CAUSES,
    "parallel drafting": "the draft is served without parallel drafting: vLLM runs it as a sequential EAGLE-3 draft and skips mask_hidden "
                         "(an explicit --speculative-config without \"parallel_drafting\": true)",
    "mask token id": "mask_token_id is not the token the draft's parallel positions were trained with",
}


class _EveryPosition(layers.Rows):
    """:class:`~specfmt.algorithms.layers.Rows` whose every position proposes (the mask positions), not only each row's last."""

    def ends(self) -> list[int]:
        return list(range(sum(self.lengths)))


class _PEagleChain(_Eagle3Chain):
    """P-EAGLE drafting (see :meth:`PEagle.proposer`): the verified pass of EAGLE-3, then one pass over k-1 mask positions."""

    def __init__(self, draft, embed, dtype, targets, mask_token_id: int):
        super().__init__(draft, embed, dtype, targets)
        self.mask_token_id = mask_token_id

    def _chains(self, d, requests, rows, drafted, feedback, k, dev, dt):
        import torch

        out = [[t] for t in drafted]
        if k == 1:
            return out
        m = k - 1
        n_rows = len(requests)
        starts = [len(tokens) - 1 for tokens, _ in requests]
        rows = _EveryPosition([m] * n_rows, rows.past, [torch.arange(s + m, device=dev) for s in starts])
        e = self.embed[torch.full((m * n_rows,), self.mask_token_id, device=self.embed.device)].to(dev, dt)[None]
        hidden = d.mask_features().to(dev, dt).expand(1, m * n_rows, -1)
        positions = torch.tensor([s + j for s in starts for j in range(m)], device=dev)
        proposed, _, _ = self.step(d, e, hidden, positions, rows)
        for r, o in enumerate(out):
            o.extend(proposed[r * m:(r + 1) * m])
        return out


@register
class PEagle(Eagle3):
    """P-EAGLE: EAGLE-3's format, checks, reference and card, plus ``mask_hidden``, the mask token and
    parallel drafting. ``specfmt train`` does not train it (issue 25 leaves training out)."""

    config = PEagleConfig
    name = PEagleConfig.name
    title = "P-EAGLE"
    vllm_method = "eagle3"  # speculators/base.py: peagle -> method eagle3, parallel_drafting true
    sglang_unserved = ("SGLang 0.5.23 has no P-EAGLE: its SpeculativeAlgorithm (srt/speculative/spec_info.py) has no parallel drafting, and "
                       "LlamaForCausalLMEagle3 (srt/models/llama_eagle3.py) has no mask_hidden; it would run the draft as sequential EAGLE-3")
    parallel_drafting = True
    interop_note = "speculators 0.9 loads this draft too (`SpeculatorModel.from_pretrained`: `PEagleDraftModel`)."
    causes = CAUSES
    key_causes = {**Eagle3.key_causes, "mask_token_id": "mask token id"}
    vllm_not_held = {**Eagle3.vllm_not_held, "mask_hidden": "vLLM copies it into a buffer, not a parameter (llama_eagle3.py: "
                                                            "register_buffer, loaded only with parallel_drafting)"}

    @property
    def training(self) -> None:
        """None: ``specfmt train`` has no P-EAGLE objective (COD sampling) yet."""
        return None

    def speculative_config(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """``parallel_drafting``: without it vLLM drafts sequentially and skips ``mask_hidden`` (``llama_eagle3.py``)."""
        return {"parallel_drafting": True}

    def expected_tensors(self, cfg: dict[str, Any]) -> dict[str, TensorSpec]:
        """EAGLE-3's table (:meth:`Eagle3.expected_tensors`) and ``mask_hidden`` [1, 1, n_aux·H_t]
        (speculators ``PEagleDraftModel``; vLLM copies its n_aux·H_t values into ``mask_hidden`` [1, fc_input_size])."""
        c = PEagleConfig.of(cfg)
        specs = super().expected_tensors(cfg)
        specs["mask_hidden"] = TensorSpec((1, 1, len(c.taps) * c.verifier_hidden_size),
                                          why="vLLM's parallel drafting reads it at every mask position and stops when it is missing (llama_eagle3.py)")
        return specs

    def card_rows(self, cfg: dict[str, Any]) -> list[tuple[str, str]]:
        """EAGLE-3's rows, then how it drafts and its mask token."""
        return super().card_rows(cfg) + [
            ("drafting", "k tokens in one parallel pass (vLLM `parallel_drafting`)"),
            ("mask token (`mask_token_id`, vLLM's `pard_token`)", str(cfg["mask_token_id"]))]

    def module_class(self) -> type:
        from .peagle_nn import PEagleDraft

        return PEagleDraft

    def readings(self, cfg: dict[str, Any], n_verifier_layers: int) -> list[Variant]:
        """EAGLE-3's (:meth:`Eagle3.readings`) but ``norm_output`` flipped (nothing is fed back in a parallel
        pass, so it changes nothing), then: served without parallel drafting (a sequential EAGLE-3 chain,
        where ``norm_output`` matters again; not a rival: a draft that starts from an EAGLE-3 draft may be accepted
        more often that way, only slower, so ``validate --run`` records its figure and the ``agreement``
        check names it when vLLM's figures look like it); the mask token read as 0 (vLLM's padding id), or as 1 when it is 0."""
        out = [r for r in super().readings(cfg, n_verifier_layers) if r.cfg.get("norm_output") == cfg.get("norm_output")]
        out.append(Variant("parallel drafting", "served without parallel drafting (sequential EAGLE-3)", cfg, {"sequential": True}, rival=False))
        other = 1 if cfg["mask_token_id"] == 0 else 0
        out.append(Variant("mask token id", f"mask_token_id {other}", {**cfg, "mask_token_id": other}))
        return out

    def proposer(self, reading: Variant, tensors: dict[str, "torch.Tensor"], embed: "torch.Tensor", lm_head: "torch.Tensor") -> Proposer:
        """k tokens per call: EAGLE-3's pass over the verified positions proposes the first (its
        last position), then one pass over k-1 positions that each read the mask token's embedding
        and ``combine(mask_hidden)`` (causal among themselves, every verified key visible) proposes
        the others -- vLLM's ``parallel_drafting``. A reading with ``sequential`` is EAGLE-3's chain."""
        chain = super().proposer(reading, tensors, embed, lm_head)
        if reading.extra.get("sequential"):
            return chain
        return _PEagleChain(chain.draft, chain.embed, chain.dtype, chain.targets, int(reading.cfg["mask_token_id"]))
