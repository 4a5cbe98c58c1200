"""DSpark: a DFlash draft (:mod:`.dflash`) plus a Markov logit-bias head and a confidence head.

The backbone drafts a block in one non-causal pass as DFlash's does. Then a low-rank Markov head adds
``markov_w2(markov_w1[prev])`` [Vd] to each slot's logits, ``prev`` being the token before the one the
slot predicts: the anchor for the first slot, the token just drafted for every later one, so drafting
is sequential inside the block (:func:`specfmt.algorithms.dspark_nn.draft_block`). A confidence head
``proj`` [1, H (+ r)] predicts each slot's acceptance; it never changes a token. With
``sample_from_anchor`` (speculators' DSpark default, DeepSpec's convention) every slot of the block
proposes: slot j proposes the token at anchor + j + 1, B tokens per pass.

Notation: DFlash's (H, V, Vd, H_t, n_aux, B) and r ``markov_rank``.

Sources: speculators 0.9 ``models/dspark/config.py`` (``DSparkSpeculatorConfig(DFlashSpeculatorConfig)``:
``sample_from_anchor`` default true, ``markov_rank`` 256, ``markov_head_type``, ``enable_confidence_head``,
``confidence_head_with_markov``), ``model_definitions.py`` (``MarkovHead``, ``ConfidenceHead``) and
``core.py`` (``DSparkDraftModel``: ``prev_token_ids``); vLLM 0.32 ``transformers_utils/configs/speculators/
algos.py::update_dspark`` (architecture ``Qwen3DSparkModel``, ``target_layer_ids`` = aux - 1,
``dspark_bonus_anchor`` = not ``sample_from_anchor``, read with default **false**; no ``dflash_config``, so
``_dflash_layer_causal`` in ``model_executor/models/qwen3_dflash.py`` makes full-attention layers non-causal
and sliding ones causal), ``model_executor/models/qwen3_dspark.py`` (``DSparkMarkovHead``: ``markov_w1``,
``markov_w2`` only; ``load_weights``), ``v1/worker/gpu/spec_decode/dspark/speculator.py`` (sequential
sampling) and ``config/vllm.py`` (``_get_v1_model_runner_unsupported_features``: "dspark speculative
decoding" -- the V1 model runner, the one the CPU build runs without Triton, refuses it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from ..format.config import register_config
from ..format.model import PositiveInt
from ..format.tensors import TensorSpec
from .base import Proposer, Variant, register
from .dflash import DFlash, DFlashConfig, _DFlashBlocks

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .reference import VerifierStates

#: why a sliding-window layer must not be read non-causal in a DSpark draft
SLIDING_TRAP = ("vLLM's DSpark reader writes no dflash_config, so qwen3_dflash.py _dflash_layer_causal builds sliding-window layers "
                "causal whatever sliding_window_non_causal says")
#: why only the vanilla Markov head is served
VANILLA_ONLY = ("vLLM 0.30-0.33 builds the vanilla head alone (qwen3_dspark.py DSparkMarkovHead holds markov_w1 and markov_w2: "
                "a gated or rnn head's gate_proj / joint_proj has nothing to load into)")


@register_config
class DSparkConfig(DFlashConfig):
    """A DSpark ``config.json`` (speculators ``DSparkSpeculatorConfig``; vLLM ``algos.update_dspark``): DFlash's
    fields and the heads'. Three fields are required because vLLM's default is not speculators':
    ``sample_from_anchor`` (vLLM false, speculators true), ``enable_confidence_head`` and
    ``confidence_head_with_markov`` (vLLM false, speculators true). Notation as :class:`~specfmt.algorithms.dflash.DFlashConfig`."""

    name: ClassVar[str] = "dspark"
    architecture: ClassVar[str] = "DSparkSpeculator"
    schema_description: ClassVar[str] = (
        "DSpark: DFlash plus a Markov logit-bias head and a confidence head, drafting sequentially inside the block "
        "(speculators models/dspark). Fields read by vLLM's algos.update_dspark.")

    sample_from_anchor: bool = Field(description=(
        "Every slot proposes (slot j: the token at anchor + j + 1; B tokens per pass) instead of the mask slots alone (B - 1). "
        "speculators' DSpark default is true, vLLM's update_dspark reads an absent one as false: always written."))
    markov_rank: PositiveInt = Field(description=(
        "r: the Markov head's rank, markov_w1 [V, r] and markov_w2 [Vd, r]. speculators' 0 (no head) is a DFlash draft: "
        "vLLM's Qwen3DSparkModel always builds the head."))
    markov_head_type: Literal["vanilla", "gated", "rnn"] = Field(description=(
        "The Markov head's variant (speculators MarkovHead). vLLM serves vanilla alone."))
    enable_confidence_head: bool = Field(description=(
        "The confidence head confidence_head.proj is present. vLLM reads an absent one as false, speculators as true: always written."))
    confidence_head_with_markov: bool = Field(description=(
        "The confidence head reads [hidden, markov_w1[prev]] (H + r) instead of the hidden state (H). "
        "vLLM reads an absent one as false, speculators as true: always written."))

    def violations(self) -> list[tuple[str, str]]:
        """DFlash's rules (:meth:`DFlashConfig.violations`) but its block-mask rule, which is DFlash's reader's; then
        ``sliding_window_non_causal`` false when a layer slides (:data:`SLIDING_TRAP`), and a vanilla Markov head
        (:data:`VANILLA_ONLY`)."""
        out = [v for v in super().violations() if v[0] != "$.sliding_window_non_causal"]
        types = self.transformer_layer_config.layer_types or []
        if self.sliding_window_non_causal and "sliding_attention" in types:
            out.append(("$.sliding_window_non_causal", f"true with sliding-window layers: {SLIDING_TRAP}; set it false"))
        if self.markov_head_type != "vanilla":
            out.append(("$.markov_head_type", f"{self.markov_head_type!r}: {VANILLA_ONLY}"))
        return out


#: the misreadings of a DSpark checkpoint: DFlash's, and the Markov head's
CAUSES = {
    **DFlash.causes,
    "markov head": "the Markov head is left out: each slot's logits lack the bias from the token before it (the draft read as DFlash)",
}


class _DSparkBlocks(_DFlashBlocks):
    """DSpark drafting as vLLM's ``DSparkSpeculator`` runs it (see :meth:`DSpark.proposer`): DFlash's block pass, then the
    Markov head slot by slot (``markov``: False leaves it out)."""

    def __init__(self, blocks: _DFlashBlocks, markov: bool):
        super().__init__(blocks.draft, blocks.embed, blocks.head, blocks.mask_token_id, causal=blocks.causal, from_anchor=blocks.from_anchor)
        self.markov = markov

    def drafted(self, tokens: list[int], states: "VerifierStates", k: int) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor | None"]:
        """(verifier ids [k], logits [k, Vd] with each slot's Markov bias, confidence logits [k] or None) of one block."""
        import torch

        from .dspark_nn import draft_block

        h = self.block_hidden(tokens, states, k)
        slots = h if self.from_anchor else h[1:]
        base = self.draft.logits(slots, self.head)
        if not self.markov:
            return self.targets[base.argmax(-1)], base, None
        anchor = torch.tensor([tokens[-1]], device=base.device)
        ids, logits, embs = draft_block(self.draft.markov_head, base[None], slots[None], anchor, self.targets)
        conf = self.draft.confidence_head(slots, embs[0]) if self.draft.confidence_head is not None else None
        return ids[0], logits[0], conf

    def block_logits(self, tokens: list[int], states: "VerifierStates", k: int) -> "torch.Tensor":
        """[k, Vd] the proposing slots' logits, each with the bias of the token drafted before it: their argmax is the draft."""
        return self.drafted(tokens, states, k)[1]


@register
class DSpark(DFlash):
    """DSpark: DFlash's format, checks and card plus the Markov and confidence heads. ``specfmt train`` does not train it.
    vLLM serves it with method ``dspark`` on the GPU build only (its V1 model runner, the CPU build's, refuses DSpark)."""

    config = DSparkConfig
    name = DSparkConfig.name
    title = "DSpark"
    vllm_method = "dspark"  # vLLM speculators/base.py: speculators_model_type is the method
    #: SGLang 0.5.23's ``DSparkDraftModel`` (``srt/models/dspark.py``: DFlash's class with ``VanillaMarkov`` and
    #: ``DSparkConfidenceHead``), run by ``--speculative-algorithm DSPARK`` (``dspark_components/dspark_worker_v2.py``)
    sglang_algorithm = "DSPARK"
    sglang_architecture = "DSparkDraftModel"
    sglang_source = "python/sglang/srt/models/dspark.py"
    sglang_anchor_sampling = True
    interop_note = "speculators 0.9 loads this draft too (`SpeculatorModel.from_pretrained`: `DSparkDraftModel`)."
    cpu_build_refusal = ("its V1 model runner, which the CPU build runs (no Triton), refuses \"dspark speculative decoding\" "
                         "(vllm/config/vllm.py _get_v1_model_runner_unsupported_features)")
    causes = CAUSES
    key_causes = {**DFlash.key_causes, "markov_rank": "markov head"}

    @property
    def training(self) -> None:
        """None: ``specfmt train`` has no DSpark objective (the issue leaves it optional: vLLM's CPU build cannot serve it)."""
        return None

    def expected_tensors(self, cfg: dict[str, Any]) -> dict[str, TensorSpec]:
        """DFlash's table (:meth:`DFlash.expected_tensors`) and the heads (speculators ``DSparkDraftModel``; vLLM ``qwen3_dspark.py``):

        ================================ ============= =========================================
        name                             shape         when
        ================================ ============= =========================================
        ``markov_head.markov_w1.weight`` [V, r]        always
        ``markov_head.markov_w2.weight`` [Vd, r]       always
        ``confidence_head.proj.weight``  [1, H (+ r)]  ``enable_confidence_head`` (+ r with Markov)
        ``confidence_head.proj.bias``    [1]           ``enable_confidence_head``
        ================================ ============= =========================================
        """
        c = DSparkConfig.of(cfg)
        specs = super().expected_tensors(cfg)
        r, why = c.markov_rank, "vLLM's Qwen3DSparkModel always builds the Markov head (qwen3_dspark.py)"
        specs["markov_head.markov_w1.weight"] = TensorSpec((c.vocab_size, r), why=why)
        specs["markov_head.markov_w2.weight"] = TensorSpec((c.draft_vocab_size, r), why=why)
        if c.enable_confidence_head:
            why = "enable_confidence_head: speculators would start it at random; vLLM drops the head without it"
            specs["confidence_head.proj.weight"] = TensorSpec((1, c.hidden_size + (r if c.confidence_head_with_markov else 0)), why=why)
            specs["confidence_head.proj.bias"] = TensorSpec((1,), why=why)
        return specs

    def module_class(self) -> type:
        from .dspark_nn import DSparkDraft

        return DSparkDraft

    def readings(self, cfg: dict[str, Any], n_verifier_layers: int) -> list[Variant]:
        """DFlash's (:meth:`DFlash.readings`: taps ± 1, mask token, causal block, ``sample_from_anchor`` flipped), then the
        draft without its Markov head (served as DFlash: one parallel argmax)."""
        return [*super().readings(cfg, n_verifier_layers), Variant("markov head", "without the Markov head", cfg, {"markov": False})]

    def proposer(self, reading: Variant, tensors: dict[str, "torch.Tensor"], embed: "torch.Tensor", lm_head: "torch.Tensor") -> Proposer:
        """k tokens per call, as vLLM's ``DSparkSpeculator._sample_sequential`` (greedy): DFlash's block pass (:meth:`DFlash.proposer`;
        with ``sample_from_anchor`` the k slots from the anchor's), then slot by slot the argmax of its logits plus
        ``markov_w2(markov_w1[prev])``, ``prev`` the anchor for the first slot and the token just drafted (a verifier id, through
        ``d2t``) for each later one (:func:`~specfmt.algorithms.dspark_nn.draft_block`)."""
        return _DSparkBlocks(super().proposer(reading, tensors, embed, lm_head), markov=reading.extra.get("markov", True))

    def sglang_fields(self, c: "DFlashConfig") -> tuple[dict[str, Any], dict[str, Any]]:
        """The heads' fields and ``sample_from_anchor`` at the top level: ``build_markov_head`` and ``build_confidence_head`` read
        ``config.markov_rank``, ``markov_head_type``, ``confidence_head_with_markov`` there (``dflash_config`` is read by
        ``parse_dspark_draft_config`` alone), and ``get_dspark_sample_from_anchor`` reads ``sample_from_anchor`` there, default
        **true**: always written. ``enable_confidence_head`` is written for ``convert``; SGLang builds the confidence head by
        ``SGLANG_RAGGED_VERIFY_MODE`` alone (none in its default, static)."""
        d = DSparkConfig.of(c.dump())
        return {}, {k: getattr(d, k) for k in ("markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov",
                                              "sample_from_anchor")}

    def sglang_block(self, c: "DFlashConfig") -> int:
        """``dflash_config.block_size`` as SGLang's DSpark reads it: gamma, the tokens one block proposes (k), not the block's
        positions (``parse_dspark_draft_config``: ``gamma = block_size``; ``_handle_dspark`` stops unless
        ``--speculative-num-draft-tokens`` is gamma + 1; the query is gamma positions with ``sample_from_anchor``, gamma + 1
        without: the format's B either way)."""
        return c.proposals

    def sglang_recorded(self, c: "DFlashConfig") -> dict[str, Any]:
        """``block_size`` is recorded as SGLang's gamma, so that ``convert --from auto`` reads B = gamma (+ 1 without
        ``sample_from_anchor``)."""
        return {"block_size": "gamma"}

    def card_rows(self, cfg: dict[str, Any]) -> list[tuple[str, str]]:
        """DFlash's rows, then the heads and where vLLM serves it."""
        c = DSparkConfig.of(cfg)
        conf = ("per-slot acceptance, over the hidden state" + (" and the Markov embedding" if c.confidence_head_with_markov else "")
                if c.enable_confidence_head else "none")
        return super().card_rows(cfg) + [
            ("Markov head (`markov_rank`, `markov_head_type`)", f"rank {c.markov_rank}, {c.markov_head_type}: drafting is sequential inside the block"),
            ("confidence head", conf),
            ("vLLM build", "GPU only: the CPU build's V1 model runner refuses DSpark")]


__all__ = ["CAUSES", "SLIDING_TRAP", "VANILLA_ONLY", "DSpark", "DSparkConfig"]
