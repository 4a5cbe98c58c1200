"""DFlash: a small non-causal decoder that drafts a whole block in one pass over the verifier's tap states.

The draft fuses n_aux tapped verifier states of every verified position through ``fc`` [H, n_aux·H_t]
and ``hidden_norm``; each draft layer projects that context with its own ``k_proj`` / ``v_proj`` (then
``k_norm`` and rotary at the context positions), and attends from a block of ``block_size`` query
positions: the anchor (the last verified token, whose verifier states do not exist yet) and
``block_size`` − 1 mask tokens (``mask_token_id``), embedded with the verifier's embedding at positions
anchor .. anchor + block_size − 1. The block sees every context position before the anchor and itself,
both ways (non-causal). Slot j ≥ 1 proposes the token at anchor + j, so one pass gives block_size − 1
tokens (``sample_from_anchor``: slot j proposes anchor + j + 1, block_size tokens). The layers are
Qwen3 layers (q/k RMSNorm per head); the draft has no embedding of its own, and an ``lm_head`` of its
own only with a draft vocabulary (Vd < V, mapped by ``d2t`` offsets as EAGLE-3's).

Notation: H ``transformer_layer_config.hidden_size``, V its ``vocab_size`` (the verifier's), Vd
``draft_vocab_size``, H_t ``target_hidden_size`` or H, n_aux the number of taps, B ``block_size``.

Sources: speculators 0.9 ``models/dflash/config.py`` (``DFlashSpeculatorConfig``), ``core.py``
(``DFlashDraftModel``: ``_backbone_forward``, ``_keys_to_ignore_on_save``), ``attention.py``
(``create_anchor_block_mask_mod``) and ``model_definitions.py`` (``Qwen3DFlashAttention``: context K/V
from ``target_hidden``); vLLM 0.32 ``transformers_utils/configs/speculators/algos.py::update_dflash``
(``target_layer_ids = aux − 1``, ``causal = not sliding_window_non_causal``), ``speculators/base.py``
(method ``dflash``), ``model_executor/models/qwen3_dflash.py`` (``DFlashQwen3ForCausalLM``,
``_dflash_layer_causal``, ``load_weights``) and ``v1/spec_decode/dflash.py`` (a query of 1 + k per request).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Callable, ClassVar, Literal

from pydantic import Field

from ..checkpoint.dtypes import DTYPE_CODES
from ..errors import Finding, InputError
from ..format.config import DecoderSizes, DecoderConfig, LayerId, SpeculatorConfig, register_config
from ..format.model import Forbidden, NonNegativeInt, Nullable, PositiveInt, Schema
from ..format.tensors import TensorSpec
from . import layers
from .base import Algorithm, AlgorithmOptions, Card, LossFigures, Proposer, Reference, Training, Variant, option, register
from .eagle3 import proposable_ids, vocab_map_check, vocab_map_problems
from .reference import ChainDrafter, VerifierStates
from .sglang import SGLANG_VERSION, SGLang, SGLangLayout, refuse

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ..checkpoint.reader import CheckpointReader
    from ..sources.verifier import Verifier, VerifierInfo


#: why ``sliding_window_non_causal`` must be true when a draft layer has full attention
CAUSAL_TRAP = ("vLLM builds every draft layer causal when it is false (update_dflash: dflash_config.causal = not sliding_window_non_causal, "
               "which qwen3_dflash.py _dflash_layer_causal applies to all layers), while speculators trains full-attention layers "
               "non-causal (models/dflash/attention.py); set it true")


class DFlashLayerConfig(DecoderConfig):
    """A DFlash draft's decoder config: Qwen3 layers (speculators ``Qwen3DFlashDecoderLayer``; vLLM ``DFlashQwen3ForCausalLM``)."""

    model_type: Literal["qwen3"]
    hidden_act: str = Field(description=(
        "The MLP activation. vLLM's DFlashQwen3ForCausalLM reads config.hidden_act with no default (qwen3_dflash.py "
        "Qwen3MLP) and stops with AttributeError without it, so it is required."))
    rms_norm_eps: float = Field(gt=0, description="RMSNorm epsilon; vLLM's qwen3_dflash.py reads config.rms_norm_eps with no default.")
    max_position_embeddings: PositiveInt = Field(description="vLLM's qwen3_dflash.py reads config.max_position_embeddings with no default.")


@register_config
class DFlashConfig(DecoderSizes, SpeculatorConfig):
    """A DFlash ``config.json`` (speculators ``DFlashSpeculatorConfig``; vLLM ``algos.update_dflash``).

    Notation: H ``transformer_layer_config.hidden_size``, V its ``vocab_size``, Vd ``draft_vocab_size``,
    H_t ``target_hidden_size`` or H, n_aux the number of taps, B ``block_size``.
    """

    name: ClassVar[str] = "dflash"
    architecture: ClassVar[str] = "DFlashSpeculator"
    schema_description: ClassVar[str] = (
        "DFlash: a block of block_size positions drafted in one non-causal pass over the verifier's tap states "
        "(speculators models/dflash). Fields read by vLLM's algos.update_dflash.")
    forbidden: ClassVar[Forbidden | None] = Forbidden(
        ("model_type",), "vLLM routes to the speculators loader only without a top-level model_type.")

    transformer_layer_config: DFlashLayerConfig
    draft_vocab_size: PositiveInt = Field(description="Vd: rows of lm_head (Vd = V: no lm_head of its own, the verifier's is used).")
    block_size: Annotated[int, Schema({"minimum": 2})] = Field(ge=2, description=(
        "B: the anchor and B-1 mask positions drafted in one pass (speculators block_size; vLLM runs a query of 1 + k)."))
    target_hidden_size: Nullable[PositiveInt] = Field(None, description="H_t, the verifier's hidden size, when it differs from H; else null.")
    aux_hidden_state_layer_ids: Annotated[list[LayerId], Schema({"uniqueItems": True})] = Field(min_length=1, description=(
        "Tap layers: id j is HF hidden_states[j], the residual stream entering verifier layer j; vLLM reads the output of layer j - 1 "
        "(dflash_config.target_layer_ids = id - 1). Ascending, distinct, at least 1."))
    mask_token_id: NonNegativeInt = Field(description=(
        "The token every mask position of the block reads (vLLM's parallel_drafting_token_id). vLLM reads "
        "config_dict['mask_token_id'] unconditionally, so it is required."))
    sliding_window_non_causal: bool = Field(description=(
        "Sliding-window layers see the whole block (speculators; full-attention layers always do). vLLM reads it as "
        "dflash_config.causal = not it, for every layer, and defaults to true where speculators defaults to false: always written."))
    sample_from_anchor: bool = Field(False, description=(
        "The anchor slot proposes too (B tokens per pass instead of B-1). vLLM's DFlash refuses it (v1/worker/gpu/spec_decode/dflash)."))

    @property
    def taps(self) -> list[int]:
        return list(self.aux_hidden_state_layer_ids)

    @property
    def proposals(self) -> int:
        """Tokens one pass proposes: B - 1, or B with ``sample_from_anchor``."""
        return self.block_size if self.sample_from_anchor else self.block_size - 1

    @classmethod
    def build(cls, verifier: "VerifierInfo", tlc: DecoderConfig | dict[str, Any], *, draft_vocab_size: int, block_size: int, taps: list[int],
              mask_token_id: int, sliding_window_non_causal: bool, sample_from_anchor: bool = False, target_hidden_size: int | None = None,
              dtype: str, **more: Any) -> "DFlashConfig":
        """A new config (without provenance), as converters write it: k = B - 1 (B with ``sample_from_anchor``); ``more``:
        a variant's own fields, written after DFlash's.

        Raises:
            pydantic.ValidationError: a value of the wrong type (a specfmt bug).
        """
        layer = tlc.dump() if isinstance(tlc, DecoderConfig) else dict(tlc)
        k = block_size if sample_from_anchor else block_size - 1
        return cls(architectures=[cls.architecture], **cls.head(verifier, k), transformer_layer_config=layer, draft_vocab_size=draft_vocab_size,
                   block_size=block_size, target_hidden_size=target_hidden_size, aux_hidden_state_layer_ids=list(taps), mask_token_id=mask_token_id,
                   sliding_window_non_causal=sliding_window_non_causal, sample_from_anchor=sample_from_anchor, **more,
                   tie_word_embeddings=False, dtype=dtype)

    def violations(self) -> list[tuple[str, str]]:
        """Beyond the shared rules: Vd <= V; ``mask_token_id`` < V; taps ascending and >= 1 (vLLM reads
        id - 1 as a layer's output); k = B - 1 (B with ``sample_from_anchor``: vLLM runs a block of 1 + k,
        and a shorter block is another non-causal computation); ``sliding_window_non_causal`` true when a
        layer has full attention (:data:`CAUSAL_TRAP`); a window kept for ``sliding_attention`` layers
        (:data:`NO_WINDOW`)."""
        out = super().violations()
        V, ids = self.vocab_size, self.aux_hidden_state_layer_ids
        if self.draft_vocab_size > V:
            out.append(("$.draft_vocab_size", f"{self.draft_vocab_size} is larger than the verifier vocabulary transformer_layer_config.vocab_size={V}"))
        if self.mask_token_id >= V:
            out.append(("$.mask_token_id", f"{self.mask_token_id} is outside the verifier vocabulary transformer_layer_config.vocab_size={V}"))
        if list(ids) != sorted(ids):
            out.append(("$.aux_hidden_state_layer_ids", f"{ids} is not ascending; vLLM concatenates the taps in ascending layer order"))
        if ids and min(ids) < 1:
            out.append(("$.aux_hidden_state_layer_ids", "0 names the embeddings; vLLM reads id - 1 as a layer's output (dflash_config.target_layer_ids)"))
        if self.speculative_tokens != self.proposals:
            what = "block_size" if self.sample_from_anchor else "block_size - 1"
            out.append(("$.speculators_config.proposal_methods[0].speculative_tokens",
                        f"{self.speculative_tokens}, but a block of {self.block_size} proposes {self.proposals} ({what}); vLLM runs a block of 1 + k"))
        types = self.transformer_layer_config.layer_types or []
        full = self.transformer_layer_config.num_hidden_layers - sum(t == "sliding_attention" for t in types)
        if not self.sliding_window_non_causal and full > 0:
            out.append(("$.sliding_window_non_causal", f"false with {full} full-attention layer(s): {CAUSAL_TRAP}"))
        if "sliding_attention" in types:
            window = layers.kept_window(self.transformer_layer_config.dump())
            if window is None:
                out.append(("$.transformer_layer_config.sliding_window", f"none kept for the sliding_attention layers: {NO_WINDOW}"))
            else:
                out += layers.window_violations(window)
        return out


#: why a ``sliding_attention`` layer needs a window its config class keeps (:func:`~specfmt.algorithms.layers.kept_window`)
NO_WINDOW = ("the config class drops sliding_window unless use_sliding_window is true (transformers' Qwen3Config), so vLLM refuses "
             "to start (qwen3_dflash.py _resolve_layer_attention: sliding attention requires a window size) and speculators "
             "builds those layers as full non-causal attention (models/dflash/attention.py); set use_sliding_window true "
             "and sliding_window, or write full_attention layers with sliding_window_non_causal true")

#: the misreadings of a DFlash checkpoint (:meth:`DFlash.readings`) and what each says
CAUSES = {
    "tap ids": "aux_hidden_state_layer_ids name other verifier layers than the draft was trained on (vLLM reads id - 1 as a layer's output)",
    "mask token id": "mask_token_id is not the token the block's mask positions were trained with",
    "block mask": ("the block is read with the other mask than the draft's layers were trained with: causal where they are non-causal "
                   "(vLLM: sliding_window_non_causal false), or both ways where sliding-window layers are causal"),
    "anchor sampling": "sample_from_anchor is read the other way: the proposals come from the wrong slots of the block",
}


class _DFlashBlocks(ChainDrafter):
    """DFlash drafting as vLLM's ``DFlashProposer`` runs it (see :meth:`DFlash.proposer`): one block pass per call."""

    def __init__(self, draft, embed, head, mask_token_id: int, *, causal: bool | None = None, from_anchor: bool = False):
        super().__init__()
        self.draft, self.embed, self.head = draft, embed, head
        self.mask_token_id, self.causal, self.from_anchor = mask_token_id, causal, from_anchor
        self.targets = draft.target_ids()

    def block_hidden(self, tokens: list[int], states: VerifierStates, k: int) -> "torch.Tensor":
        """[S, H] the block's normed hidden states: S = k + 1 (the anchor and k mask slots), or k with ``from_anchor``."""
        import torch

        first = states.hidden[0]
        dt, dev = first.dtype, first.device
        d = self.draft.to(dev, dt)
        T = len(tokens) - 1
        aux = torch.cat([states.hidden[t][:T] for t in d.taps], dim=-1)
        S = k if self.from_anchor else k + 1
        ids = torch.tensor([tokens[-1]] + [self.mask_token_id] * (S - 1), device=self.embed.device)
        block = self.embed[ids].to(dev, dt)[None]
        out = d(block, d.context(aux)[None], torch.arange(T, device=dev), torch.arange(T, T + S, device=dev), causal=self.causal)
        return out[0]

    def block_logits(self, tokens: list[int], states: VerifierStates, k: int) -> "torch.Tensor":
        """[k, Vd] the logits of the k proposing slots (slots 1..k; 0..k-1 with ``from_anchor``)."""
        h = self.block_hidden(tokens, states, k)
        return self.draft.logits(h if self.from_anchor else h[1:], self.head)

    def propose_many(self, requests: list[tuple[list[int], VerifierStates]], k: int) -> list[list[int]]:
        import torch

        with torch.no_grad():
            return [[int(self.targets[int(x)]) for x in self.block_logits(tokens, states, k).argmax(-1)] for tokens, states in requests]


#: verifier ``architectures[0]`` -> the SGLang file of its class, for the classes whose ``set_dflash_layers_to_capture(ids)``
#: captures ``[id + 1 for id in ids]`` ("SGLang captures 'before layer i'": the output of layer id, HF ``hidden_states[id + 1]``),
#: the DFlash family's only tap rule in SGLang 0.5.23; a class without the method (``Qwen2ForCausalLM``) cannot serve DFLASH
SGLANG_DFLASH_CAPTURE: dict[str, str] = {
    "LlamaForCausalLM": "srt/models/llama.py",
    "MistralForCausalLM": "srt/models/mistral.py",
    "Qwen3ForCausalLM": "srt/models/qwen3.py",
    "Qwen3MoeForCausalLM": "srt/models/qwen3_moe.py",
    "DeepseekV2ForCausalLM": "srt/models/deepseek_v2.py",
    "DeepseekV3ForCausalLM": "srt/models/deepseek_v2.py",
    "Glm4MoeLiteForCausalLM": "srt/models/glm4_moe_lite.py",
    "GptOssForCausalLM": "srt/models/gpt_oss.py",
}


class DFlashSGLang(SGLang):
    """The DFlash family in SGLang 0.5.23: ``DFlashDraftModel`` (``python/sglang/srt/models/dflash.py``), run by the DFLASH
    worker (``srt/speculative/dflash_worker_v2.py``). DFlash2 and DSpark are this part with their own class, fields and block
    (:meth:`sglang_fields`, :meth:`sglang_block`).

    What SGLang's code does, and so what the export writes or refuses:

    * **Config.** A flat Qwen3 config (``DFlashAttention`` builds q/k norms, ``qkv_proj`` and ``o_proj`` with
      ``attention_bias``, rotary from the config) and ``dflash_config`` (``dflash_utils.py`` ``parse_dflash_draft_config``):
      ``block_size``, ``mask_token_id`` and ``target_layer_ids``, HF layer-output ids that the verifier class captures
      ``+ 1`` (:data:`SGLANG_DFLASH_CAPTURE`): the format's taps - 1, as vLLM reads them. ``num_target_layers`` is the
      verifier's N (SGLang warns when it differs).
    * **Tensors.** ``load_weights`` takes the format's names (q/k/v and gate/up fused) and **ignores every name it does not
      know** ("Ignore unexpected weights"). The draft has no embedding and no head: the worker embeds the block with the
      verifier's embedding and projects with the verifier's ``lm_head``, over the full vocabulary. So a draft vocabulary
      (``d2t``), a draft's own ``lm_head`` or ``embed_tokens`` would be skipped: refused. ``fc`` is ``nn.Linear(n·H, H)``:
      taps as wide as the draft (H_t = H) only.
    * **The block.** The worker's block is ``--speculative-num-draft-tokens`` positions (B: the verified anchor and B - 1
      mask tokens); each layer attends to the context's keys and values (``fc`` → ``hidden_norm`` → ``kv_proj_only``,
      ``k_norm``, rotary: ``_append_target_hidden_sequential``) and to the whole block, full-attention layers
      ``ENCODER_ONLY`` (non-causal); slots 1 .. B - 1 propose. A draft sampling from the anchor has no reading there, nor
      do sliding-window layers (causal there, with SGLang's window): refused.
    * **The mask token.** ``mask_token_id`` is read as written; when the verifier's tokenizer has SGLang's default
      ``mask_token`` ``<|MASK|>`` under another id, SGLang stops at start (a loud error, not a misreading).
    """

    sglang_algorithm = "DFLASH"
    sglang_architecture = "DFlashDraftModel"
    sglang_source = "python/sglang/srt/models/dflash.py"

    def sglang_layout(self, cfg: dict[str, Any], shapes: dict[str, tuple[int, ...]], verifier: "VerifierInfo",
                      tensor: Callable[[str], Any], embedding: Callable[[], Any]) -> SGLangLayout:
        c = self.config.of(cfg)
        self._sglang_refusals(c, shapes, verifier)
        nested, top = self.sglang_fields(c)
        tlc = {k: v for k, v in c.transformer_layer_config.dump().items() if k != "architectures"}
        ids = [t - 1 for t in c.taps]
        config = {"architectures": [self.sglang_architecture], **tlc, "num_target_layers": verifier.num_hidden_layers,
                  "dflash_config": {"block_size": self.sglang_block(c), "mask_token_id": c.mask_token_id, "target_layer_ids": ids, **nested},
                  **top, "tie_word_embeddings": False}
        arch = verifier.architectures[0]
        notes = [f"target_layer_ids written {ids} (layer outputs): SGLang's {arch} captures {c.taps} ({SGLANG_DFLASH_CAPTURE[arch]}, "
                 "set_dflash_layers_to_capture: id + 1)"]
        return SGLangLayout(config, {n: n for n in shapes}, notes=notes, recorded=self.sglang_recorded(c))

    def sglang_fields(self, c: "DFlashConfig") -> tuple[dict[str, Any], dict[str, Any]]:
        """The algorithm's own fields: (inside ``dflash_config``, at the top level). DFlash has none."""
        return {}, {}

    def sglang_block(self, c: "DFlashConfig") -> int:
        """``dflash_config.block_size`` as SGLang reads it: DFlash's block B (the worker's ``--speculative-num-draft-tokens``)."""
        return c.block_size

    def sglang_recorded(self, c: "DFlashConfig") -> dict[str, Any]:
        """What the provenance records for ``convert --from auto`` beyond the config SGLang reads (DFlash: nothing)."""
        return {}

    def _sglang_refusals(self, c: "DFlashConfig", shapes: dict[str, tuple[int, ...]], verifier: "VerifierInfo") -> None:
        """The DFlash-family drafts SGLang does not run as specfmt's reference and vLLM do, each with its reason key."""
        arch = verifier.architectures[0] if verifier.architectures else "?"
        tlc = c.transformer_layer_config
        if arch not in SGLANG_DFLASH_CAPTURE:
            raise refuse("verifier", f"SGLang {SGLANG_VERSION}'s {arch}: its set_dflash_layers_to_capture was not read by this specfmt "
                         f"(known: {', '.join(SGLANG_DFLASH_CAPTURE)}; Qwen2ForCausalLM has none)", hint="serve this draft with vLLM")
        if c.verifier_hidden_size != c.hidden_size:
            raise refuse("target_hidden_size", f"target_hidden_size {c.verifier_hidden_size} differs from hidden_size {c.hidden_size}: SGLang's "
                         f"{self.sglang_architecture} builds fc as nn.Linear(n_aux·hidden_size, hidden_size) (srt/models/dflash.py)",
                         hint="serve this draft with vLLM")
        if c.draft_vocab_size != c.vocab_size:
            raise refuse("draft_vocab", f"draft_vocab_size {c.draft_vocab_size} < {c.vocab_size}: SGLang's DFLASH worker projects every slot with "
                         "the verifier's lm_head over the full vocabulary and has no d2t; the draft's lm_head and d2t would be skipped",
                         hint="serve this draft with vLLM")
        for name, what in (("lm_head.weight", "own_lm_head"), ("embed_tokens.weight", "own_embedding")):
            if name in shapes:
                raise refuse(what, f"the draft has its own {name}, but SGLang's {self.sglang_architecture} has none: the DFLASH worker uses the "
                             "verifier's embedding and lm_head, and load_weights ignores the draft's silently", hint="serve this draft with vLLM")
        if c.sample_from_anchor and not self.sglang_anchor_sampling:
            raise refuse("sample_from_anchor", "sample_from_anchor is true, but SGLang's DFLASH worker proposes from the block's mask slots only "
                         "(dflash_worker_v2.py: hidden_states[:, 1:])", hint="serve this draft with vLLM")
        if tlc.layer_types and "sliding_attention" in tlc.layer_types:
            raise refuse("sliding_window", "sliding-window draft layers: SGLang builds them causal within its window (dflash.py "
                         "_get_dflash_layer_attention_params), which specfmt has not checked against its reference",
                         hint="serve this draft with vLLM, or train one for SGLang with `specfmt train dflash --block-mask non-causal`")
        if tlc.attention_bias or tlc.mlp_bias:
            raise refuse("bias", "attention_bias/mlp_bias: SGLang's DFlashMLP has no biases, and its attention biases are not checked by specfmt",
                         hint="serve this draft with vLLM")
        if (tlc.hidden_act or "silu") != "silu":
            raise refuse("activation", f"hidden_act {tlc.hidden_act!r}: SGLang's DFlashMLP runs silu or swigluoai only", hint="serve this draft with vLLM")

    #: the worker has a reading of ``sample_from_anchor`` (DSpark's: ``get_dspark_sample_from_anchor``)
    sglang_anchor_sampling: ClassVar[bool] = False

    def sglang_flags(self, cfg: dict[str, Any], k: int) -> list[str]:
        """The worker's verify window, ``--speculative-num-draft-tokens``: the block B = k + 1 (the anchor and k mask slots)."""
        return ["--speculative-num-draft-tokens", str(k + 1)]


# --------------------------------------------------------------------------- training (speculators 0.9's DFlash objective)


#: what each loss weighting and loss name means (``--position-weight``, ``--loss``)
POSITION_WEIGHTS = ("dpace", "exp")
LOSSES = ("ce", "kl")
#: ``--block-mask``: what each slot of a block sees of the block (:func:`~specfmt.algorithms.dflash_nn.block_causal`)
BLOCK_MASKS = ("causal", "non-causal")
#: speculators' denominator guard (``losses/utils.py`` ``_LOSS_REDUCTION_EPS``)
LOSS_EPS = 1e-5


@dataclass
class DFlashOptions(AlgorithmOptions):
    """``specfmt train dflash``'s own options: a new draft's shape and speculators 0.9's DFlash objective
    (``speculators/train/config/schema.py`` ``DFlashArgs``, ``DataArgs.max_anchors``, ``LossArgs``; the defaults are its
    ``--speculator-type dflash`` defaults: ``TrainConfig._resolve_derived_defaults``)."""

    block_size: int = option(16, "--block-size", "New draft: B, the anchor and B - 1 mask slots drafted in one pass (k = B - 1; "
                             "speculators' DFlash default 16).", new_only=True, at_least=2)
    layers: int = option(5, "--layers", "New draft: decoder layers (speculators' DFlash default 5).", new_only=True, at_least=1)
    taps: list[int] | None = option(None, "--aux-layers", "New draft: tap layer ids (HF hidden_states ids, vLLM reads id - 1), e.g. "
                                    "2,16,29 (default: 2, N//2, N-3, speculators' resolve_target_layer_ids).", new_only=True)
    mask_token: int | None = option(None, "--mask-token-id", "New draft: the token of the block's mask slots (default: the tokenizer's "
                                    "mask token, else the first id past the tokenizer when the embedding has one, else pad, eos or unk: "
                                    "speculators' resolve_mask_token_id).", new_only=True)
    block_mask: str = option("causal", "--block-mask", "New draft: causal (each slot sees the block's slots up to itself: "
                             "speculators' DFlash default, written as its trainer writes it, sliding-window layers with "
                             "sliding_window_non_causal false and the verifier's context as the window; vLLM serves it, SGLang "
                             "0.5.23 is not checked and refused) or non-causal (each slot sees the whole block, as z-lab's "
                             "DFlash drafts). The default is the trainer benchmark's winner (docs/measured.md).",
                             new_only=True)
    max_anchors: int = option(512, "--max-anchors", "Blocks per step and process, spread evenly over the --batch-size windows "
                              "(speculators' max_anchors per packed row; 512 of 8 x 256 positions).", at_least=1, recorded=True)
    position_weight: str = option("dpace", "--position-weight", "Weight of block slot j in the loss: dpace (speculators' DFlash "
                                  "default: D-PACE's suffix sums of smoothed confidence) or exp (exp(-(j-1)/gamma)).", recorded=True)
    decay_gamma: float = option(4.0, "--decay-gamma", "gamma of --position-weight exp (speculators' dflash_decay_gamma).", recorded=True)
    dpace_alpha: float = option(0.5, "--dpace-alpha", "Smoothing of --position-weight dpace, in (0, 1] (speculators').", recorded=True)
    loss: str = option("ce", "--loss", "ce (cross-entropy on the verifier's top-1; speculators' DFlash default) or kl (KL "
                       "divergence from the verifier's distribution).", recorded=True)


def select_anchors(loss_mask: "torch.Tensor", n: int, block_size: int, generator: "torch.Generator | None") -> tuple["torch.Tensor", "torch.Tensor"]:
    """Each window's anchors: ``(anchors [B, n] long, valid [B, n] bool)``.

    speculators' rule per window (``models/dflash/utils.py`` ``select_anchors``): the positions under the loss mask but the
    last ``block_size``, ``min(n, that many)`` of them drawn by ``randperm`` (``generator``), sorted; the rest padded with
    position 0, not valid. speculators draws over one packed row of several samples and so lets a block near a sample's end
    reach into the next sample; here a block stays inside its window (for one window the draws are the same).
    """
    import torch

    B, T = loss_mask.shape
    anchors = torch.zeros(B, n, dtype=torch.long, device=loss_mask.device)
    valid = torch.zeros(B, n, dtype=torch.bool, device=loss_mask.device)
    for b in range(B):
        ok = loss_mask[b].bool().clone()
        ok[max(0, T - block_size):] = False
        idx = ok.nonzero().squeeze(-1)
        k = min(n, idx.numel())
        perm = torch.randperm(idx.numel(), generator=generator).to(idx.device)
        anchors[b, :k] = idx[perm[:k]].sort().values
        valid[b, :k] = True
    return anchors, valid


def position_weights(kind: str, elementwise: "torch.Tensor", mask: "torch.Tensor", gamma: float, alpha: float) -> "torch.Tensor":
    """[..., S] the weight of each block slot in the loss (slot 0, the anchor, proposes nothing and weighs 0).

    ``exp``: ``exp(-(j - 1) / gamma)`` for slot j >= 1 (speculators ``losses/utils.py`` ``dflash_loss_decay``).
    ``dpace``: D-PACE (``dpace_loss_decay``): with ``q = exp(-loss)`` (the masked per-slot cross-entropy, no gradient)
    and ``c = (1 - alpha) q + alpha`` (1 where masked), slot j weighs ``mask_j * sum_{i >= j} mask_i * prod_{l <= i} c_l``.

    Args:
        elementwise: [..., S] the per-slot loss, already multiplied by ``mask``.
        mask: [..., S] float, the slots that count.
    """
    import torch

    S = mask.shape[-1]
    j = torch.arange(S, device=mask.device, dtype=elementwise.dtype)
    if kind == "exp":
        return (torch.exp(-(j - 1).clamp(min=0) / gamma) * (j != 0).to(elementwise.dtype)).expand_as(mask)
    with torch.no_grad():
        q = torch.exp(-elementwise).float()
        smooth = torch.where(mask > 0, (1.0 - alpha) * q + alpha, torch.ones_like(q))
        prefix = torch.cumprod(smooth, dim=-1)
        return torch.flip(torch.cumsum(torch.flip(prefix * mask, dims=[-1]), dim=-1), dims=[-1]) * mask


def dflash_loss(draft: Any, embed: "torch.Tensor", head: "torch.Tensor", ids: "torch.Tensor", aux: "torch.Tensor", last: "torch.Tensor",
                options: DFlashOptions, *, generator: "torch.Generator | None" = None, normaliser: Any = None,
                loss_mask: "torch.Tensor | None" = None, anchors: "tuple[torch.Tensor, torch.Tensor] | None" = None) -> LossFigures:
    """speculators 0.9's DFlash objective on a batch of windows (``models/dflash/core.py`` ``DFlashDraftModel._backbone_forward``
    and ``forward``, ``models/dflash/metrics.py`` ``compute_metrics``, ``losses/utils.py`` ``loss_function``):

    * **anchor blocks**: ``max_anchors / B`` anchors per window (:func:`select_anchors`); block a is the anchor's token and
      ``block_size - 1`` mask tokens (``mask_token_id``), embedded with ``embed``, at positions anchor .. anchor + S - 1;
    * **the block mask**: each block sees its window's context ``hidden_norm(fc(taps))`` before its anchor and its own
      slots, non-causal (:meth:`~specfmt.algorithms.dflash_nn.DFlashDraft.blocks`);
    * **the targets**: slot j >= 1 learns the verifier's distribution at anchor + j - 1 (``head(last)``: the token at
      anchor + j); slot 0 and padded anchors do not count, nor slots whose position is off the loss mask;
    * **the loss over the block positions**: cross-entropy on the verifier's top-1 (``ce``) or KL from its distribution
      (``kl``) per slot, times the loss mask and :func:`position_weights`, summed and divided by the counted slots
      (+1e-5), as one packed row: every window's slots together.

    Args:
        draft: the :class:`~specfmt.algorithms.dflash_nn.DFlashDraft` (train mode).
        embed: [V, H] the verifier's embedding; head: [V, H] its ``lm_head`` weight.
        ids: [B, T]; aux: [B, T, n_aux·H_t] the taps; last: [B, T, H_t] the verifier's last state after its final norm.
        normaliser: ``counts -> divisor`` over processes (:func:`specfmt.training.loop.global_normaliser`); None: the count.
        loss_mask: [B, T] bool, or None for every position.
        anchors: ``(anchors, valid)`` to use instead of drawing them (tests).

    Returns:
        :class:`~specfmt.algorithms.base.LossFigures` with per-slot figures for slots 1 .. B - 1: counted are the slots that
        count, correct those whose top draft token is the verifier's top-1 (the conditional ones among top-1 tokens in the
        draft vocabulary).
    """
    import torch

    B, T = ids.shape
    S = draft.cfg["block_size"]
    mask = torch.ones(B, T, dtype=torch.bool, device=ids.device) if loss_mask is None else loss_mask.bool()
    if anchors is None:
        anchors = select_anchors(mask, -(-options.max_anchors // B), S, generator)
    at, valid = anchors
    slots = at[..., None] + torch.arange(S, device=ids.device)  # [B, A, S]
    rows = torch.arange(B, device=ids.device)[:, None, None]
    block_ids = torch.full_like(slots, draft.mask_token_id)
    block_ids[..., 0] = ids[rows[..., 0], at]
    hidden = draft.blocks(embed[block_ids].to(aux.dtype), draft.context(aux), at)
    logits = draft.logits(hidden[:, :, 1:], head).float()  # [B, A, S-1, Vd]
    with torch.no_grad():
        target = last[rows, slots[..., :-1]]  # slot j's target: the verifier's state at anchor + j - 1
        tlogits = (target @ head.to(target.dtype).T).float()
        if hasattr(draft, "t2d"):
            tlogits = tlogits[..., draft.t2d]  # the draft vocabulary's rows (speculators: verifier_lm_head = lm_head[t2d])
    counted_mask = (mask[rows, slots[..., 1:]] & valid[..., None]).float()  # [B, A, S-1]
    if options.loss == "ce":
        per = torch.nn.functional.cross_entropy(logits.flatten(0, 2), tlogits.argmax(-1).flatten(), reduction="none").view_as(counted_mask)
    else:
        per = torch.nn.functional.kl_div(logits.log_softmax(-1), tlogits.softmax(-1), reduction="none").sum(-1)
    full_mask = torch.cat([torch.zeros_like(counted_mask[..., :1]), counted_mask], dim=-1)  # slot 0 never counts
    full_per = torch.cat([torch.zeros_like(per[..., :1]), per * counted_mask], dim=-1)
    weights = position_weights(options.position_weight, full_per, full_mask, options.decay_gamma, options.dpace_alpha)
    counts = full_mask.sum().to(torch.float64)[None]
    divisor = normaliser(counts)[0] if normaliser is not None else counts[0]
    loss = (full_per * weights).sum() / (divisor.to(full_per.dtype) + LOSS_EPS)
    with torch.no_grad():
        pred, top = logits.argmax(-1), tlogits.argmax(-1)
        hit = (pred == top) & (counted_mask > 0)
        seen = counted_mask > 0
        correct = [int(hit[..., j].sum()) for j in range(S - 1)]
        counted = [int(seen[..., j].sum()) for j in range(S - 1)]
    return LossFigures(loss, correct, counted)


def mask_token_id(verifier: "Verifier", V: int) -> int:
    """A new draft's mask token by speculators' order (``train/utils.py`` ``resolve_mask_token_id``): the tokenizer's mask
    token; else the first id past the tokenizer when the embedding has unused rows (speculators adds ``<|MASK|>`` there);
    else its pad, eos or unk token.

    Raises:
        InputError: none of them exists (give ``--mask-token-id``).
    """
    tok = verifier.tokenizer()
    if tok.mask_token_id is not None:
        return int(tok.mask_token_id)
    if len(tok) < V:
        return len(tok)
    for name in ("pad_token_id", "eos_token_id", "unk_token_id"):
        if getattr(tok, name, None) is not None:
            return int(getattr(tok, name))
    raise InputError("the verifier's tokenizer has no mask, pad, eos or unk token and the embedding no unused row",
                     hint="give --mask-token-id")


@register
class DFlash(Algorithm, Reference, Training, Card, DFlashSGLang):
    """DFlash: format, checks, reference run (a block per pass), training (speculators 0.9's objective), card and the
    SGLang export (:class:`DFlashSGLang`)."""

    config = DFlashConfig
    name = DFlashConfig.name
    title = "DFlash"
    vllm_method = "dflash"  # vLLM speculators/base.py: speculators_model_type dflash -> method dflash
    parallel_drafting = True  # the block in one non-causal pass (DSpark's Markov head runs inside that pass)
    interop_note = "speculators 0.9 loads this draft too (`SpeculatorModel.from_pretrained`: `DFlashDraftModel`)."
    map_tensors = ("d2t", "t2d")
    vllm_aliases = {"draft_id_to_target_id": "d2t"}
    vllm_not_held = {"t2d": "vLLM maps draft ids with d2t alone; qwen3_dflash.py load_weights skips t2d"}
    vllm_only = {"mask_embedding": "vLLM's [H] override of the mask token's embedding, zeros and unused unless a mask_embedding.pt "
                                   "ships beside the weights (qwen3_dflash.py _read_mask_embedding)"}
    causes = CAUSES
    key_causes = {"aux_hidden_state_layer_ids": "tap ids", "mask_token_id": "mask token id", "sliding_window_non_causal": "block mask",
                  "sample_from_anchor": "anchor sampling"}

    # -- format ------------------------------------------------------------------------------

    def expected_tensors(self, cfg: dict[str, Any]) -> dict[str, TensorSpec]:
        """DFlash (speculators ``DFlashDraftModel`` state dict less ``_keys_to_ignore_on_save``; vLLM ``qwen3_dflash.py``):

        ============================== ====================== =====================================
        name                           shape                  when
        ============================== ====================== =====================================
        ``fc.weight``                  [H, n_aux·H_t]         always
        ``hidden_norm.weight``         [H]                    always (the context's norm)
        ``layers.{i}.*``               Qwen3 layer, H wide    q/k/v/o, q_norm/k_norm [d], MLP, two norms
        ``norm.weight``                [H]                    always
        ``lm_head.weight``             [Vd, H]                Vd < V (else optional: the verifier's)
        ``d2t`` / ``t2d``              [Vd] int64 / [V] bool  when Vd < V
        ``embed_tokens.weight``        [V, H]                 required when H_t ≠ H, else optional
        ============================== ====================== =====================================

        Not saved by speculators, never expected: ``verifier_lm_head``, ``verifier_norm``; ``mask_hidden``
        (vLLM's loader stops on it).
        """
        c = DFlashConfig.of(cfg)
        tlc = c.transformer_layer_config
        H, V, Vd, Ht, n_aux = c.hidden_size, c.vocab_size, c.draft_vocab_size, c.verifier_hidden_size, len(c.taps)
        specs: dict[str, TensorSpec] = {"fc.weight": TensorSpec((H, n_aux * Ht)), "hidden_norm.weight": TensorSpec((H,))}
        for i in range(tlc.num_hidden_layers):
            specs.update(layers.layer_specs(f"layers.{i}", tlc, H))
        specs["norm.weight"] = TensorSpec((H,))
        specs["lm_head.weight"] = TensorSpec((Vd, H), required=Vd < V, why="Vd < V: the verifier's lm_head has other rows (speculators saves it)")
        if Vd < V:
            why_vocab = "Vd < V: without d2t vLLM reads draft id i as target id i and acceptance collapses"
            specs["d2t"] = TensorSpec((Vd,), "int64", why=why_vocab)
            specs["t2d"] = TensorSpec((V,), "bool", why=why_vocab)
        specs["embed_tokens.weight"] = TensorSpec((V, H), required=Ht != H, why="H_t != H: the verifier's embedding has the wrong width for the draft")
        return specs

    def verifier_hidden_size(self, cfg: dict[str, Any]) -> int:
        return DFlashConfig.of(cfg).verifier_hidden_size

    # -- static validation ---------------------------------------------------------------------

    def vocab_map_check(self, cfg: dict[str, Any], reader: "CheckpointReader") -> tuple[str, str, list[str]]:
        """EAGLE-3's check of ``d2t`` / ``t2d`` (:func:`~specfmt.algorithms.eagle3.vocab_map_check`)."""
        return vocab_map_check(cfg, reader)

    def proposable_ids(self, cfg: dict[str, Any], tensors: dict[str, "torch.Tensor"]) -> list[int] | None:
        """EAGLE-3's ``arange(Vd) + d2t`` (:func:`~specfmt.algorithms.eagle3.proposable_ids`; vLLM ``qwen3_dflash.py`` maps with ``d2t``)."""
        return proposable_ids(cfg, tensors)

    def verifier_problems(self, cfg: dict[str, Any], verifier: "VerifierInfo") -> list["str | Finding"]:
        """Taps beyond the verifier: id j is read as the output of layer j - 1, so j <= N - 1 (N: the
        verifier's layers; HF ``hidden_states[N]`` is after the final norm, vLLM's layer N - 1 output is not)."""
        N = verifier.num_hidden_layers
        bad = [t for t in cfg["aux_hidden_state_layer_ids"] if t >= N]
        return [Finding.at("$.aux_hidden_state_layer_ids", f"tap layers {bad} are not below the verifier's {N} layers", kind="rule")] if bad else []

    def tensor_problems(self, cfg: dict[str, Any], small: dict[str, Any]) -> list[str]:
        if "d2t" not in small and "t2d" not in small:
            return []
        return vocab_map_problems(small.get("d2t"), small.get("t2d"), cfg["transformer_layer_config"]["vocab_size"], cfg["draft_vocab_size"])

    def speculative_token_limit(self, cfg: dict[str, Any]) -> tuple[int, str] | None:
        """B - 1 (B with ``sample_from_anchor``): the slots of one block that propose."""
        return DFlashConfig.of(cfg).proposals, f"proposing slots in its block of {cfg['block_size']}"

    # -- reference run ---------------------------------------------------------------------------

    def module_class(self) -> type:
        from .dflash_nn import DFlashDraft

        return DFlashDraft

    def module(self, cfg: dict[str, Any], tensors: dict[str, "torch.Tensor"] | None = None, share: bool = False):
        """The draft (:class:`~specfmt.algorithms.dflash_nn.DFlashDraft`) with ``tensors`` loaded (strict; random when None;
        ``share``: the tensors themselves, frozen); it has an ``lm_head`` of its own when Vd < V or ``tensors`` hold one.

        Raises:
            KeyError, RuntimeError: ``tensors`` do not fit the config.
        """
        own = cfg["draft_vocab_size"] < cfg["transformer_layer_config"]["vocab_size"] or (tensors is not None and "lm_head.weight" in tensors)
        return layers.load_state(self.module_class()(cfg, own_head=own), tensors, share=share)

    def readings(self, cfg: dict[str, Any], n_verifier_layers: int) -> list[Variant]:
        """As written, then: taps ± 1 (the off-by-one between HF ``hidden_states[j]`` and vLLM's output of layer j, which
        ``target_layer_ids = aux - 1`` settles); the mask token read as 0 (1 when it is 0); the other block mask (causal in every
        layer where the config's are non-causal, as vLLM with ``sliding_window_non_causal`` false; non-causal where the config's
        sliding-window layers are causal, :func:`~specfmt.algorithms.dflash_nn.block_causal`); ``sample_from_anchor`` flipped
        (the proposals taken from the other slots)."""
        out = [Variant(None, "as written", cfg)]
        taps = list(cfg["aux_hidden_state_layer_ids"])
        for label, alt in (("taps + 1", [t + 1 for t in taps]), ("taps - 1", [t - 1 for t in taps])):
            if all(0 <= t < n_verifier_layers for t in alt):
                out.append(Variant("tap ids", f"{label}: {alt}", {**cfg, "aux_hidden_state_layer_ids": alt}))
        other = 1 if cfg["mask_token_id"] == 0 else 0
        out.append(Variant("mask token id", f"mask_token_id {other}", {**cfg, "mask_token_id": other}))
        from .dflash_nn import block_causal

        causal = not any(block_causal(cfg))
        out.append(Variant("block mask", f"{'causal' if causal else 'non-causal'} block mask", cfg, {"causal": causal}))
        anchor = not cfg.get("sample_from_anchor", False)
        out.append(Variant("anchor sampling", f"sample_from_anchor {str(anchor).lower()}", {**cfg, "sample_from_anchor": anchor}))
        return out

    def proposer(self, reading: Variant, tensors: dict[str, "torch.Tensor"], embed: "torch.Tensor", lm_head: "torch.Tensor") -> Proposer:
        """k tokens per call from one block pass, as vLLM's ``DFlashProposer`` (``v1/spec_decode/dflash.py``; the query layout of
        ``utils/cpu_triton_utils.py::_copy_and_expand_dflash_inputs_kernel_impl``: ids [bonus, mask × k] at positions last + 1 ..
        last + 1 + k, slots 1..k sampled). The context is
        ``hidden_norm(fc(taps))`` of every verified position before the anchor (tap id j: ``hidden[j]``), at its own position;
        the block is the anchor (the newest token, at position T) and k mask tokens at T+1..T+k, embedded with the verifier's
        embedding (the draft's own when it ships one), each layer's block mask as the config says
        (:func:`~specfmt.algorithms.dflash_nn.block_causal`); slot j proposes ``d2t``-mapped argmax for the token at T+j.
        ``sample_from_anchor``: k slots from the anchor's. ``lm_head``: the verifier's, used when the draft has none (Vd = V)."""
        cfg = reading.cfg
        draft = self.module(cfg, tensors, share=True).eval()
        own = draft.embed_tokens if draft.embed_tokens is not None else embed
        return _DFlashBlocks(draft, own, lm_head, int(cfg["mask_token_id"]), causal=reading.extra.get("causal"),
                             from_anchor=bool(cfg.get("sample_from_anchor")))

    # -- training --------------------------------------------------------------------------------

    train_summary = "Train a DFlash draft (a block of --block-size drafted in one pass; speculators 0.9's objective)."
    train_options = DFlashOptions
    #: ``specfmt train dflash``'s ``--lr`` and ``--optimizer``: the specfmt setting with the best three-seed mean acceptance
    #: length at 500 steps on the Qwen3 world's larger held-out set in ``benchmarks/trainer_vs_speculators.results.json``
    #: (``defaults_from_results``; ``tests/test_trainer_bench.py`` holds these to it, issue 38): Muon at 6e-2 (seed 1237:
    #: 1.642 at 3e-2, 1.687 at 6e-2, 1.639 at 1e-1; AdamW not measured)
    train_defaults = {"lr": 6e-2, "optimizer": "muon"}

    def check_options(self, options: DFlashOptions, *, init: bool) -> None:
        """The shared checks; ``--position-weight`` and ``--loss`` name one of theirs, D-PACE goes with ``ce``
        (speculators ``TrainConfig._validate_dpace``) and ``--dpace-alpha`` in (0, 1]."""
        super().check_options(options, init=init)
        if options.position_weight not in POSITION_WEIGHTS:
            raise InputError(f"--position-weight must be {' or '.join(POSITION_WEIGHTS)}, not {options.position_weight!r}")
        if options.loss not in LOSSES:
            raise InputError(f"--loss must be {' or '.join(LOSSES)}, not {options.loss!r}")
        if options.position_weight == "dpace" and options.loss != "ce":
            raise InputError("--position-weight dpace needs --loss ce (speculators: D-PACE reads the per-slot cross-entropy)",
                             hint="give --loss ce, or --position-weight exp")
        if not 0 < options.dpace_alpha <= 1 or options.decay_gamma <= 0:
            raise InputError("--dpace-alpha must be in (0, 1] and --decay-gamma above 0")
        if options.block_mask not in BLOCK_MASKS:
            raise InputError(f"--block-mask must be {' or '.join(BLOCK_MASKS)}, not {options.block_mask!r}")

    def new_config(self, verifier: "Verifier", shape: DFlashOptions) -> dict[str, Any]:
        """A full-vocabulary DFlash draft of Qwen3 layers shaped like one verifier layer, k = B - 1; non-causal
        (``sliding_window_non_causal`` true: :data:`CAUSAL_TRAP`), or with ``--block-mask causal`` as speculators' trainer
        writes its default (``DFlashDraftModel.from_training_args``): every layer ``sliding_attention`` with the verifier's
        ``max_position_embeddings`` as the window (no context position falls out) and the flag false
        (:func:`~specfmt.algorithms.dflash_nn.block_causal`).

        Raises:
            InputError: taps outside [1, N - 1], or a mask token outside the vocabulary.
        """
        info = verifier.info
        N, V = info.num_hidden_layers, info.vocab_size
        tlc = layers.decoder_config(layers.verifier_decoder_fields(verifier.text_config, "qwen3"), info.hidden_size,
                                    verifier.text_config["num_attention_heads"], V, info, DTYPE_CODES[shape.dtype], shape.layers)
        taps = list(shape.taps) if shape.taps else [2, N // 2, N - 3]
        if sorted(set(taps)) != taps or taps[0] < 1 or taps[-1] > N - 1:
            raise InputError(f"tap layer ids {taps} must be distinct, ascending and in [1, {N - 1}] (vLLM reads id - 1)")
        mask = shape.mask_token if shape.mask_token is not None else mask_token_id(verifier, V)
        if not 0 <= mask < V:
            raise InputError(f"--mask-token-id {mask} is outside the verifier's vocabulary of {V}")
        if shape.speculative_tokens is not None and shape.speculative_tokens != shape.block_size - 1:
            raise InputError(f"--speculative-tokens {shape.speculative_tokens}: a block of {shape.block_size} proposes {shape.block_size - 1}",
                             hint="set --block-size to k + 1 instead")
        causal = shape.block_mask == "causal"
        if causal:
            if not info.max_position_embeddings:
                raise InputError("--block-mask causal writes the verifier's context length as the window, and its config has no "
                                 "max_position_embeddings", hint="give --block-mask non-causal")
            tlc = {**tlc.dump(), "layer_types": ["sliding_attention"] * shape.layers, "use_sliding_window": True,
                   "sliding_window": info.max_position_embeddings}
        return DFlashConfig.build(info, tlc, draft_vocab_size=V, block_size=shape.block_size, taps=taps, mask_token_id=mask,
                                  sliding_window_non_causal=not causal, dtype=shape.dtype).dump()

    def new_draft(self, cfg: dict[str, Any], verifier: "Verifier", docs: Any):
        """A new draft's tensors: the module's initialisation (no lm_head: the verifier's serves the full vocabulary, frozen,
        as speculators keeps it)."""
        module = self.module(cfg)
        return {n: t.detach().clone() for n, t in module.state_dict().items()}, {}

    def feature_taps(self, cfg: dict[str, Any]) -> list[int]:
        return list(cfg["aux_hidden_state_layer_ids"])

    def train_positions(self, module: Any, options: DFlashOptions) -> int:
        """The proposing slots of a block: B - 1."""
        return module.cfg["block_size"] - 1

    def loss(self, module: Any, *, embed: Any, head: Any, ids: Any, aux: Any, last: Any, options: DFlashOptions, generator: Any,
             subset: list[int] | None, normaliser: Any = None, loss_mask: Any = None) -> LossFigures:
        """:func:`dflash_loss` (``head``: the verifier's ``lm_head`` module)."""
        return dflash_loss(module, embed, head.weight, ids, aux, last, options, generator=generator, normaliser=normaliser,
                           loss_mask=loss_mask)

    # -- publishing ------------------------------------------------------------------------------

    def card_rows(self, cfg: dict[str, Any]) -> list[tuple[str, str]]:
        """The block, what one pass proposes, the taps (with vLLM's id - 1), the mask token, the block mask, the vocabulary."""
        c = DFlashConfig.of(cfg)
        vd, v = c.draft_vocab_size, c.vocab_size
        slots = "the anchor and every mask slot" if c.sample_from_anchor else "the mask slots (the anchor is the verified token)"
        return [("block size (`block_size`)", f"{c.block_size}: {c.proposals} tokens per pass, from {slots}"),
                ("tap layers (`aux_hidden_state_layer_ids`)", f"{', '.join(map(str, c.taps))} (vLLM's `target_layer_ids`: "
                                                               f"{', '.join(str(t - 1) for t in c.taps)})"),
                ("mask token (`mask_token_id`)", str(c.mask_token_id)),
                ("block mask", "non-causal (`sliding_window_non_causal` true)" if c.sliding_window_non_causal else "causal in sliding-window layers"),
                ("draft vocabulary", f"{vd:,} of the verifier's {v:,} ids" + (" (`d2t`/`t2d` map)" if vd != v else ""))] + super().card_rows(cfg)


__all__ = ["CAUSAL_TRAP", "CAUSES", "SGLANG_DFLASH_CAPTURE", "DFlash", "DFlashConfig", "DFlashLayerConfig", "DFlashOptions", "DFlashSGLang",
           "dflash_loss", "mask_token_id", "position_weights", "select_anchors"]
