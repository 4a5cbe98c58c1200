"""EAGLE-1/2 and HASS (Li et al., "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty", 2024; HASS, Zhang et al. 2024): everything specfmt knows of it.

The draft reads ``fc(cat([embed(ids), h_verifier]))``, where ``h_verifier`` is the verifier's
last hidden state after its final norm, through Llama layers whose first has no input norm,
and proposes with the verifier's own ``lm_head`` (no final norm). EAGLE-2 changes only the
tree search, HASS only the training; the weights are the same. Sources: SafeAILab/EAGLE
``eagle/model/cnets1.py`` (branch ``v1``: ``cnets.py``); vLLM ``llama_eagle.py``
(``EagleLlamaForCausalLM``, method ``eagle``). vLLM 0.32's speculators reader has no ``eagle``
algorithm, so the config also carries vLLM's native Llama draft config at the top level.

The reference forward pass (:class:`~specfmt.algorithms.eagle_nn.Eagle1Draft`, the one the
proposer, the trainer and the converters' checks share)::

    x = fc(cat([embed(ids), h_verifier], -1))        # fc.bias when present
    x = layer_0(x)                                   # Llama layer, input norm = Identity
    x = layer_i(x)  for i >= 1                       # standard pre-norm Llama layers
    return x                                          # fed to the verifier's lm_head
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal

from pydantic import Field

from ..checkpoint.dtypes import DTYPE_CODES
from ..errors import InputError
from ..format.config import DecoderConfig, SpeculatorConfig, register_config
from ..format.model import ConfigModel, Forbidden, PositiveInt, PositiveNumber, Unchecked
from ..format.tensors import TensorSpec
from . import layers
from .base import Algorithm, AlgorithmOptions, Card, Proposer, Reference, Training, Variant, option, register
from .reference import DecoderChain
from .sglang import SGLANG_VERSION, SGLang, SGLangLayout, refuse, same_tensor

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ..format.draft import Draft
    from ..sources.verifier import Verifier, VerifierInfo


class EagleLayerConfig(DecoderConfig):
    """An EAGLE-1 draft's decoder config: Llama layers (vLLM's ``EagleLlamaForCausalLM``)."""

    model_type: Literal["llama"]


@register_config
class EagleConfig(SpeculatorConfig, EagleLayerConfig):
    """An eagle ``config.json``: vLLM's native ``EagleLlamaForCausalLM`` draft config (a ``LlamaConfig``) at
    the top level, which is what vLLM 0.32 reads, next to the speculators block; ``transformer_layer_config``
    repeats it (:meth:`~specfmt.format.config.SpeculatorConfig.native_violations`). vLLM builds a
    ``LlamaConfig`` from the top level, so the fields the decoder config may leave out are required here."""

    name: ClassVar[str] = "eagle"
    architecture: ClassVar[str] = "EagleLlamaForCausalLM"
    pin_architecture: ClassVar[bool] = True
    native: ClassVar[bool] = True
    schema_description: ClassVar[str] = (
        "EAGLE-1/2 and HASS (Li et al. 2024, arXiv:2401.15077; SafeAILab/EAGLE eagle/model/cnets1.py; HArmonizedSS/HASS). Served by vLLM's "
        "EagleLlamaForCausalLM (vllm/model_executor/models/llama_eagle.py) with method eagle: fc [H, 2H] without bias, layer 0 without "
        "input_layernorm, the verifier's lm_head, no final norm. A source fc.bias is folded exactly into the layer-0 attention biases "
        "(attention_bias: true).")
    forbidden: ClassVar[Forbidden | None] = Forbidden(
        ("bias", "qkv_bias", "eagle_fc_bias"),
        "'bias' means q/k/v/o attention bias to vLLM's Llama layer (vLLM PR #9580), qkv_bias overrides it, eagle_fc_bias is vLLM V0 only; "
        "write attention_bias instead.")

    model_type: Literal["llama"] = Field(description="vLLM builds the draft config from the top-level fields (LlamaConfig).")
    transformer_layer_config: EagleLayerConfig
    #: unchecked at the top level, as config v1 had it (a null there validated); transformer_layer_config's is typed
    rope_parameters: Unchecked[Any] = None
    head_dim: PositiveInt
    rms_norm_eps: PositiveNumber
    hidden_act: str
    max_position_embeddings: PositiveInt
    rope_theta: PositiveNumber
    attention_bias: bool = Field(description="q/k/v and o_proj biases in every layer (vLLM LlamaDecoderLayer).")
    mlp_bias: bool

    @classmethod
    def build(cls, verifier: "VerifierInfo", tlc: DecoderConfig | dict[str, Any], *, speculative_tokens: int) -> EagleConfig:
        """A new config (without provenance): ``architectures``, the decoder config's fields at the top
        level in its order, the speculators block, and the decoder config itself.

        Raises:
            pydantic.ValidationError: a value of the wrong type (a specfmt bug).
        """
        layer = tlc.dump() if isinstance(tlc, ConfigModel) else dict(tlc)
        native = {key: val for key, val in layer.items() if key != "architectures"}
        return cls(architectures=[cls.architecture], **native, **cls.head(verifier, speculative_tokens), transformer_layer_config=layer)


def build_config(verifier: "VerifierInfo", tlc: DecoderConfig | dict[str, Any], *, speculative_tokens: int) -> dict[str, Any]:
    """An eagle config.json (without provenance): :meth:`EagleConfig.build`, dumped."""
    return EagleConfig.build(verifier, tlc, speculative_tokens=speculative_tokens).dump()


def reference_module(tensors: dict[str, "torch.Tensor"], cfg: dict[str, Any], *, dtype: Any = None, device: Any = None, share: bool = False):
    """The draft (:class:`~specfmt.algorithms.eagle_nn.Eagle1Draft`) holding ``tensors`` as a research
    checkpoint or the format has them: ``fc.bias`` is kept (a biased ``fc``), q/k/v biases without an
    ``o_proj`` bias (EAGLE-Qwen2's ``qkv_bias``) get a zero ``o_proj`` bias, the layer count is the
    tensors' and ``rotary_emb`` buffers are dropped.

    Args:
        tensors: names ``fc.*``, ``layers.{i}.*`` and optionally ``embed_tokens.weight`` (kept aside
            as the attribute ``embed_tokens``).
        cfg: the decoder's Llama fields (``hidden_size``, heads, ``rope_theta`` ...).
        dtype, device: where the module's weights go (None: float32 on the CPU; ``share`` keeps the
            tensors' own).
        share: the module's parameters are ``tensors`` themselves (:func:`specfmt.algorithms.layers.load_state`).

    Raises:
        KeyError / RuntimeError: a tensor the layers need is missing or misshaped.
    """
    import torch

    from .eagle_nn import Eagle1Draft

    attention_bias = any(n.endswith("_proj.bias") and ".self_attn." in n for n in tensors)
    n_layers = 1 + max(int(n.split(".")[1]) for n in tensors if n.startswith("layers."))
    module = Eagle1Draft({**cfg, "attention_bias": attention_bias, "num_hidden_layers": n_layers}, fc_bias="fc.bias" in tensors)
    module = module.to(device, dtype) if (dtype is not None or device is not None) and not share else module
    state = {n: t for n, t in tensors.items() if "rotary_emb" not in n}
    if attention_bias:
        for i, layer in enumerate(module.layers):
            like = state[f"layers.{i}.self_attn.q_proj.weight"]
            for p in ("q", "k", "v", "o"):
                out = getattr(layer.self_attn, f"{p}_proj").out_features
                state.setdefault(f"layers.{i}.self_attn.{p}_proj.bias", torch.zeros(out, dtype=like.dtype, device=like.device))
    return layers.load_state(module, state, share=share)


def eagle1_forward(tensors: dict[str, "torch.Tensor"], cfg: dict[str, Any], embeds: "torch.Tensor", verifier_hidden: "torch.Tensor") -> "torch.Tensor":
    """Run an EAGLE-1 draft over one sequence: :class:`~specfmt.algorithms.eagle_nn.Eagle1Draft`'s forward
    pass on tensors in the research layout or the format's (:func:`reference_module`).

    Args:
        tensors / cfg: the draft, as for :func:`reference_module`.
        embeds: [T, H] token embeddings of the input ids (already shifted as EAGLE does).
        verifier_hidden: [T, H] the verifier's last hidden state (after its final norm).

    Returns:
        [T, H] the draft's output features, in the dtype and on the device of ``embeds``.

    Raises:
        KeyError: a tensor the layers need is missing.
    """
    import torch

    dev, dt = embeds.device, embeds.dtype
    module = reference_module(tensors, cfg, dtype=dt, device=dev).eval()
    with torch.no_grad():
        x, _ = module(embeds[None], verifier_hidden.to(dev, dt)[None], torch.arange(embeds.shape[0], device=dev))
    return x[0]


def eagle1_proposer(tensors: dict[str, "torch.Tensor"], cfg: dict[str, Any], lm_head: "torch.Tensor", embed: "torch.Tensor") -> "Proposer":
    """EAGLE-1 chain drafting (``cnets1.py``; vLLM ``EagleLlamaForCausalLM``) as a :data:`~specfmt.algorithms.base.Proposer`.

    Position j of the draft reads the embedding of token j+1 and the verifier's last hidden
    state at j (after its final norm); each drafted token's draft feature is fed back as the
    hidden state of the next position. Logits are ``lm_head(feature)`` with the verifier's
    head and no norm.

    The draft keeps a KV cache of each sequence's verified positions between calls
    (:class:`~specfmt.algorithms.reference.DraftCache`) and runs several sequences in one pass
    (:class:`~specfmt.algorithms.reference.DecoderChain`), as vLLM does; it runs where the
    verifier's states are, in their dtype.

    Args:
        tensors / cfg: the draft, as for :func:`reference_module` (the module shares the tensors).
        lm_head: [V, H] the verifier's head.
        embed: [V, H] the embedding the draft uses (its own copy, else the verifier's).
    """
    return _Eagle1Chain(reference_module(tensors, cfg, share=True).eval(), embed, lm_head)


class _Eagle1Chain(DecoderChain):
    """See :func:`eagle1_proposer`."""

    def __init__(self, draft, embed, lm_head):
        super().__init__(draft, embed)
        self.lm_head = lm_head

    def read(self, draft, states, start: int, end: int):
        """The verifier's last hidden state (after its final norm): [end - start, H]."""
        return states.hidden[-1][start:end]

    def step(self, draft, embeds, hidden, positions, rows):
        features, kv = draft(embeds, hidden, positions, rows=rows)
        head = self.lm_head.to(features.device, features.dtype)
        return [int((f @ head.T).argmax()) for f in features[0]], features, kv


def draft_module(cfg: dict[str, Any], tensors: dict[str, "torch.Tensor"] | None = None):
    """The EAGLE-1/2 (and HASS) draft as a trainable ``torch.nn.Module`` with specfmt tensor names.

    :class:`~specfmt.algorithms.eagle_nn.Eagle1Draft` (``cnets1.py``; vLLM ``llama_eagle.py``) over a
    batch: ``x = fc(cat([embed, h], -1))``, then Llama layers, layer 0 without its input norm.
    ``forward(embeds [B, T, H], hidden [B, T, H], positions [T], past=None, mask=None)``
    returns ``(features [B, T, H], kv)``; logits are the verifier's ``lm_head(features)``.

    Args:
        cfg: a specfmt eagle ``config.json`` (the decoder's Llama fields at the top level).
        tensors: the checkpoint's tensors (specfmt names; no ``fc.bias``), or None for a
            random initialisation.

    Raises:
        KeyError / RuntimeError: ``tensors`` do not fit the config.
    """
    from .eagle_nn import Eagle1Draft

    return layers.load_state(Eagle1Draft(cfg), tensors)


def eagle1_loss(draft, embed: "torch.Tensor", head: Callable, ids: "torch.Tensor", last: "torch.Tensor", noise: float = 0.0,
                generator: "torch.Generator | None" = None, loss_mask: "torch.Tensor | None" = None):
    """EAGLE-1 loss of one batch: ``SmoothL1(f_t, h_{t+1}) + 0.1 · CE(head(f_t), softmax(head(h_{t+1})))``.

    Args:
        draft: a :func:`draft_module` (train mode).
        embed: [V, H] the (frozen) embedding the draft reads.
        head: the verifier's ``lm_head`` (frozen): [..., H] -> [..., V].
        ids: [B, T] token ids.
        last: [B, T, H] the verifier's last hidden state (after its final norm).
        noise: half-width of the uniform noise added to the input features (EAGLE's
            augmentation against its own feature errors at inference); 0 for none.
        generator: the noise's random generator (seeded per step by :func:`fit`).
        loss_mask: [B, T] bool or None (every position): the prediction of ``last[t]`` (feature and token
            distribution) counts only when ``loss_mask[t]``, and both terms are means over the counted
            predictions (speculators' alignment of the mask with the targets, ``speculators/models/eagle3/data.py``
            ``shift_batch``).

    Returns:
        ``(loss, [correct], [counted])``.
    """
    import torch
    import torch.nn.functional as F

    L = ids.shape[1] - 1
    h = last[:, :-1]
    if noise:
        h = h + (torch.rand(h.shape, generator=generator, device="cpu").to(h.device, h.dtype) * 2 - 1) * noise
    f, _ = draft(embed[ids[:, 1:]], h, torch.arange(L, device=ids.device))
    target = last[:, 1:]
    with torch.no_grad():
        p = head(target).float().softmax(-1)
    logits = head(f).float()
    if loss_mask is None or bool(loss_mask[:, 1:].all()):  # every target counts: the unmasked means, bit for bit
        loss = F.smooth_l1_loss(f.float(), target.float()) + 0.1 * -(p * logits.log_softmax(-1)).sum(-1).mean()
        correct = int((logits.argmax(-1) == p.argmax(-1)).sum())
        return loss, [correct], [p.shape[0] * p.shape[1]]
    m = loss_mask[:, 1:].to(device=f.device, dtype=torch.bool)
    n = m.sum()
    w = m.float() / n.clamp(min=1)
    regress = F.smooth_l1_loss(f.float(), target.float(), reduction="none").mean(-1)
    loss = (regress * w).sum() + 0.1 * (-(p * logits.log_softmax(-1)).sum(-1) * w).sum()
    correct = int(((logits.argmax(-1) == p.argmax(-1)) & m).sum())
    return loss, [correct], [int(n)]


@dataclass
class EagleOptions(AlgorithmOptions):
    """``specfmt train eagle``'s own options: the input-feature noise and a new draft's depth."""

    noise: float = option(0.0, "--noise", "Uniform noise half-width on the input features (EAGLE's augmentation).")
    layers: int = option(1, "--layers", "New draft: decoder layers.", new_only=True)


#: verifier ``architectures[0]`` -> the SGLang file of its class, for the classes that hand their logits processor the
#: last hidden state *after* the final norm (``LogitsProcessor._get_hidden_states_to_store`` stores it for the EAGLE
#: worker, or ``hidden_states_before_norm`` instead whenever a class passes one): what SGLang feeds an EAGLE-1 draft
SGLANG_FINAL_NORMED: dict[str, str] = {
    "LlamaForCausalLM": "srt/models/llama.py",
    "MistralForCausalLM": "srt/models/mistral.py",
    "Qwen2ForCausalLM": "srt/models/qwen2.py",
    "Qwen3ForCausalLM": "srt/models/qwen3.py",
    "Qwen3MoeForCausalLM": "srt/models/qwen3_moe.py",
}
#: verifier classes that pass ``hidden_states_before_norm``, so that SGLang's EAGLE worker feeds the draft the state
#: *before* the final norm, which no EAGLE-1 draft was trained on (its reference reads the final-normed state)
SGLANG_BEFORE_NORM: dict[str, str] = {
    "MiMoV2FlashForCausalLM": "srt/models/mimo_v2.py",
    "Step3p5ForCausalLM": "srt/models/step3p5.py",
}


class EagleSGLang(SGLang):
    """EAGLE-1/2 (and HASS) in SGLang 0.5.23: ``LlamaForCausalLMEagle`` (``python/sglang/srt/models/llama_eagle.py``),
    ``--speculative-algorithm EAGLE``.

    What its code does, and so what the export writes or refuses:

    * ``LlamaModel`` there is ``fc = nn.Linear(2H, H)`` **with a bias**, then Llama layers, layer 0 without
      ``input_layernorm`` (deleted), no final norm: the reference's forward. The format has no ``fc.bias`` (a research
      bias is folded into layer 0's attention biases, exactly), so the export writes ``fc.bias`` as zeros: SGLang's
      ``fc`` then computes exactly the format's, and ``convert --from auto`` drops an all-zero ``fc.bias`` (it adds nothing).
    * ``load_weights`` prefixes ``model.`` to every name but ``lm_head`` and hands it to ``LlamaForCausalLM.load_weights``
      (q/k/v and gate/up fused); the names written are the format's own. Its Llama layers build q/k/v **and** o_proj
      biases from ``attention_bias`` (``LlamaAttention``: ``bias=attention_bias`` for both), so a folded draft is
      written as it is; their MLP has no bias (``mlp_bias`` refused).
    * The EAGLE worker (``EAGLEWorkerV2.init_lm_head``, not EAGLE-3) calls ``set_embed_and_head`` with the verifier's
      embedding and head: the draft proposes with the verifier's ``lm_head`` (as the reference) and embeds with the
      verifier's embedding, so a draft's own ``embed_tokens`` survives only when it is the verifier's.
    * The verifier state the worker feeds the draft is what the verifier class hands its logits processor
      (``LogitsProcessor._get_hidden_states_to_store``; ``hidden_states_before_norm`` when the class passes one): the
      final-normed last hidden state for the classes of :data:`SGLANG_FINAL_NORMED`, as the reference reads; the
      state before the norm for those of :data:`SGLANG_BEFORE_NORM` (refused), and any other class is refused unread.
    """

    sglang_algorithm = "EAGLE"
    sglang_architecture = "LlamaForCausalLMEagle"
    sglang_source = "python/sglang/srt/models/llama_eagle.py"

    def sglang_layout(self, cfg: dict[str, Any], shapes: dict[str, tuple[int, ...]], verifier: "VerifierInfo",
                      tensor: Callable[[str], Any], embedding: Callable[[], Any]) -> SGLangLayout:
        c = EagleConfig.of(cfg)
        self._sglang_refusals(c, verifier)
        notes = [f"the verifier's {verifier.architectures[0]} ({SGLANG_FINAL_NORMED[verifier.architectures[0]]}) feeds the draft its "
                 "final-normed last hidden state, as the reference reads it"]
        if "embed_tokens.weight" in shapes:
            own, theirs = tensor("embed_tokens.weight"), embedding()
            if not same_tensor(own, theirs):
                how = (f" (by up to {float((own.double() - theirs.double()).abs().max()):.3g}: e.g. a copy rounded to {str(own.dtype)[6:]})"
                       if own.shape == theirs.shape else f" ({list(own.shape)} against {list(theirs.shape)})")
                raise refuse("own_embedding", f"the draft has its own embed_tokens.weight, which differs from the verifier's{how}, and SGLang's "
                             "EAGLE worker gives an EAGLE-1 draft the verifier's embedding and head (EAGLEWorkerV2.init_lm_head: "
                             "set_embed_and_head)", hint="serve this draft with vLLM, which keeps its own embedding; a draft without "
                             "embed_tokens.weight reads the verifier's in specfmt, vLLM and SGLang alike")
            notes.append("embed_tokens.weight equals the verifier's embedding: written, and SGLang's set_embed_and_head replaces it with the same values")
        tlc = {k: v for k, v in c.transformer_layer_config.dump().items() if k != "architectures"}
        config = {"architectures": [self.sglang_architecture], **tlc, "tie_word_embeddings": False}
        derived = {"fc.bias": ("zeros: SGLang's fc (nn.Linear(2H, H)) has a bias and the format has none; convert --from auto drops an all-zero "
                               "fc.bias", lambda: _zero_fc_bias(tensor("fc.weight")))}
        return SGLangLayout(config, {n: n for n in shapes}, notes=notes, derived=derived)

    def _sglang_refusals(self, c: "EagleConfig", verifier: "VerifierInfo") -> None:
        """The EAGLE-1 drafts and verifiers SGLang does not run as the reference does, each with its reason key."""
        arch = verifier.architectures[0] if verifier.architectures else "?"
        if arch in SGLANG_BEFORE_NORM:
            raise refuse("verifier_state", f"SGLang {SGLANG_VERSION}'s {arch} ({SGLANG_BEFORE_NORM[arch]}) passes hidden_states_before_norm to its "
                         "logits processor, so SGLang's EAGLE worker would feed the draft the verifier's last hidden state before the final "
                         "norm, and an EAGLE-1 draft reads it after the norm", hint="serve this draft with vLLM")
        if arch not in SGLANG_FINAL_NORMED:
            raise refuse("verifier", f"which hidden state SGLang {SGLANG_VERSION}'s {arch} feeds an EAGLE-1 draft was not read by this specfmt "
                         f"(known: {', '.join(SGLANG_FINAL_NORMED)})", hint="each SGLang verifier class hands its logits processor its own state")
        if c.transformer_layer_config.mlp_bias:
            raise refuse("bias", "mlp_bias: SGLang's Llama layers build gate/up/down without biases (LlamaMLP)", hint="serve this draft with vLLM")
        if c.transformer_layer_config.layer_types and "sliding_attention" in c.transformer_layer_config.layer_types:
            raise refuse("sliding_window", "sliding-window draft layers: SGLang sets a draft window only from --speculative-draft-window-size, "
                         "for every layer", hint="serve this draft with vLLM")

    def sglang_flags(self, cfg: dict[str, Any], k: int) -> list[str]:
        """Chain drafting of k tokens: k steps, top-1, k + 1 draft tokens (SGLang's EAGLE tree of one branch)."""
        return ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(k + 1)]


def _zero_fc_bias(fc_weight: "torch.Tensor") -> "torch.Tensor":
    """The ``fc.bias`` SGLang's ``nn.Linear(2H, H)`` needs and the format does not have: zeros [H] in ``fc``'s dtype."""
    import torch

    return torch.zeros(fc_weight.shape[0], dtype=fc_weight.dtype)


@register
class Eagle(Algorithm, Reference, Training, Card, EagleSGLang):
    config = EagleConfig
    name = EagleConfig.name
    title = "EAGLE-1/2"
    vllm_method = "eagle"
    train_summary = "Train an EAGLE-1/2 draft (feature regression + 0.1 x token loss) against the frozen verifier."
    train_options = EagleOptions
    interop_note = "speculators 0.9 cannot load this draft: it has no EAGLE-1/2 class (its `eagle` model and converter were removed in speculators #332 and #672)."

    def expected_tensors(self, cfg: dict[str, Any]) -> dict[str, TensorSpec]:
        """EAGLE-1/2 and HASS (``docs/design/research-formats.md`` §2.3/§2.5; vLLM ``llama_eagle.py``):

        ============================== ====================== =====================================
        name                           shape                  when
        ============================== ====================== =====================================
        ``fc.weight``                  [H, 2H]                always (no ``fc.bias``: vLLM's fc has none)
        ``layers.0.*``                 Llama layer            **without** ``input_layernorm`` (Identity)
        ``layers.{i≥1}.*``             standard Llama layer   ``num_hidden_layers`` > 1
        ``layers.{i}.self_attn.*.bias`` [nH·d] / [nKV·d] / [H] ``attention_bias`` (q/k/v and o_proj)
        ``embed_tokens.weight``        [V, H]                 optional (vLLM shares the verifier's when equal)
        ============================== ====================== =====================================

        No ``norm.weight`` and no ``lm_head.weight``: the draft uses the verifier's head.
        """
        c = EagleConfig.of(cfg)
        H = c.hidden_size
        specs: dict[str, TensorSpec] = {"fc.weight": TensorSpec((H, 2 * H))}
        for i in range(c.num_hidden_layers):
            specs.update(layers.layer_specs(f"layers.{i}", c, H, input_norm=i > 0))
        specs["embed_tokens.weight"] = TensorSpec((c.vocab_size, H), required=False)
        return specs

    def new_config(self, verifier: "Verifier", shape: EagleOptions) -> dict[str, Any]:
        info = verifier.info
        tlc = layers.decoder_config(layers.verifier_decoder_fields(verifier.text_config), info.hidden_size,
                                    verifier.text_config["num_attention_heads"], info.vocab_size, info, DTYPE_CODES[shape.dtype], shape.layers)
        return build_config(info, tlc, speculative_tokens=self.default_speculative_tokens(shape))

    def module_class(self) -> type:
        from .eagle_nn import Eagle1Draft

        return Eagle1Draft

    def module(self, cfg: dict[str, Any], tensors: dict[str, "torch.Tensor"] | None = None):
        return layers.load_state(self.module_class()(cfg), tensors)

    def proposer(self, reading: Variant, tensors: dict[str, "torch.Tensor"], embed: "torch.Tensor", lm_head: "torch.Tensor") -> Proposer:
        return eagle1_proposer(tensors, reading.cfg, lm_head, tensors.get("embed_tokens.weight", embed))

    def loss(self, module: Any, *, embed: Any, head: Any, ids: Any, aux: Any, last: Any, options: EagleOptions, generator: Any,
             subset: list[int] | None, normaliser: Any = None, loss_mask: Any = None):
        return eagle1_loss(module, embed, head, ids, last, options.noise, generator, loss_mask)

    def new_draft(self, cfg: dict[str, Any], verifier: "Verifier", docs: list[list[int]] | None):
        tensors = {n: t.detach().clone() for n, t in self.module(cfg).state_dict().items()}
        tensors["embed_tokens.weight"] = verifier.embedding().float()
        return tensors, {"embed_tokens.weight": "the verifier's input embedding, copied (EAGLE-1 shares and freezes it)"}

    def fill_embed(self, draft: "Draft", verifier: "Verifier") -> dict[str, str]:
        """Copy the verifier's embedding into ``embed_tokens.weight``, which the draft was trained with (frozen).

        Raises:
            InputError: the draft already has one, or the verifier's is not [V, H].
        """
        from .eagle3 import copy_embedding

        if "embed_tokens.weight" in draft.tensors:
            raise InputError("the draft already has embed_tokens.weight")
        return copy_embedding(draft, verifier)
