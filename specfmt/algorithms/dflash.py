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

from typing import TYPE_CHECKING, Annotated, Any, Callable, ClassVar, Literal

from pydantic import Field

from ..errors import Finding
from ..format.config import DecoderSizes, DecoderConfig, LayerId, SpeculatorConfig, register_config
from ..format.model import Forbidden, NonNegativeInt, Nullable, PositiveInt, Schema
from ..format.tensors import TensorSpec
from . import layers
from .base import Algorithm, Card, Proposer, Reference, Variant, register
from .eagle3 import proposable_ids, vocab_map_check, vocab_map_problems
from .reference import ChainDrafter, VerifierStates
from .sglang import SGLANG_VERSION, SGLang, SGLangLayout, refuse

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ..checkpoint.reader import CheckpointReader
    from ..sources.verifier import VerifierInfo


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
        layer has full attention (:data:`CAUSAL_TRAP`)."""
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
        return out


#: the misreadings of a DFlash checkpoint (:meth:`DFlash.readings`) and what each says
CAUSES = {
    "tap ids": "aux_hidden_state_layer_ids name other verifier layers than the draft was trained on (vLLM reads id - 1 as a layer's output)",
    "mask token id": "mask_token_id is not the token the block's mask positions were trained with",
    "block mask": "the block is read causally where DFlash's is non-causal (vLLM: sliding_window_non_causal false)",
    "anchor sampling": "sample_from_anchor is read the other way: the proposals come from the wrong slots of the block",
}


class _DFlashBlocks(ChainDrafter):
    """DFlash drafting as vLLM's ``DFlashProposer`` runs it (see :meth:`DFlash.proposer`): one block pass per call."""

    def __init__(self, draft, embed, head, mask_token_id: int, *, causal: bool = False, from_anchor: bool = False):
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
                         "_get_dflash_layer_attention_params), which specfmt has not checked against its reference", hint="serve this draft with vLLM")
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


@register
class DFlash(Algorithm, Reference, Card, DFlashSGLang):
    """DFlash: format, checks, reference run (a block per pass) and card. ``specfmt train`` does not train it."""

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
        ``target_layer_ids = aux - 1`` settles); the mask token read as 0 (1 when it is 0); the block read causally (vLLM with
        ``sliding_window_non_causal`` false); ``sample_from_anchor`` flipped (the proposals taken from the other slots)."""
        out = [Variant(None, "as written", cfg)]
        taps = list(cfg["aux_hidden_state_layer_ids"])
        for label, alt in (("taps + 1", [t + 1 for t in taps]), ("taps - 1", [t - 1 for t in taps])):
            if all(0 <= t < n_verifier_layers for t in alt):
                out.append(Variant("tap ids", f"{label}: {alt}", {**cfg, "aux_hidden_state_layer_ids": alt}))
        other = 1 if cfg["mask_token_id"] == 0 else 0
        out.append(Variant("mask token id", f"mask_token_id {other}", {**cfg, "mask_token_id": other}))
        out.append(Variant("block mask", "causal block mask", cfg, {"causal": True}))
        anchor = not cfg.get("sample_from_anchor", False)
        out.append(Variant("anchor sampling", f"sample_from_anchor {str(anchor).lower()}", {**cfg, "sample_from_anchor": anchor}))
        return out

    def proposer(self, reading: Variant, tensors: dict[str, "torch.Tensor"], embed: "torch.Tensor", lm_head: "torch.Tensor") -> Proposer:
        """k tokens per call from one block pass, as vLLM's ``DFlashProposer`` (``v1/spec_decode/dflash.py``; the query layout of
        ``utils/cpu_triton_utils.py::_copy_and_expand_dflash_inputs_kernel_impl``: ids [bonus, mask × k] at positions last + 1 ..
        last + 1 + k, slots 1..k sampled). The context is
        ``hidden_norm(fc(taps))`` of every verified position before the anchor (tap id j: ``hidden[j]``), at its own position;
        the block is the anchor (the newest token, at position T) and k mask tokens at T+1..T+k, embedded with the verifier's
        embedding (the draft's own when it ships one), non-causal; slot j proposes ``d2t``-mapped argmax for the token at T+j.
        ``sample_from_anchor``: k slots from the anchor's. ``lm_head``: the verifier's, used when the draft has none (Vd = V)."""
        cfg = reading.cfg
        draft = self.module(cfg, tensors, share=True).eval()
        own = draft.embed_tokens if draft.embed_tokens is not None else embed
        return _DFlashBlocks(draft, own, lm_head, int(cfg["mask_token_id"]), causal=bool(reading.extra.get("causal")),
                             from_anchor=bool(cfg.get("sample_from_anchor")))

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


__all__ = ["CAUSAL_TRAP", "CAUSES", "SGLANG_DFLASH_CAPTURE", "DFlash", "DFlashConfig", "DFlashLayerConfig", "DFlashSGLang"]
