"""EAGLE-1/2 and HASS (Li et al., "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty", 2024; HASS, Zhang et al. 2024): everything specfmt knows of it.

The draft reads ``fc(cat([embed(ids), h_verifier]))``, where ``h_verifier`` is the verifier's
last hidden state after its final norm, through Llama layers whose first has no input norm,
and proposes with the verifier's own ``lm_head`` (no final norm). EAGLE-2 changes only the
tree search, HASS only the training; the weights are the same. Sources: SafeAILab/EAGLE
``eagle/model/cnets1.py`` (branch ``v1``: ``cnets.py``); vLLM ``llama_eagle.py``
(``EagleLlamaForCausalLM``, method ``eagle``). vLLM 0.32's speculators reader has no ``eagle``
algorithm, so the config also carries vLLM's native Llama draft config at the top level.

The reference forward pass, built on transformers' Llama layers::

    x = fc(cat([embed(ids), h_verifier], -1))        # fc.bias when present
    x = layer_0(x)                                   # Llama layer, input norm = Identity
    x = layer_i(x)  for i >= 1                       # standard pre-norm Llama layers
    return x                                          # fed to the verifier's lm_head
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal

from pydantic import Field

from ..checkpoint.dtypes import DTYPE_CODES
from ..errors import InputError
from ..format.config import DecoderConfig, SpeculatorConfig, register_config
from ..format.model import ConfigModel, Forbidden, PositiveInt, PositiveNumber
from ..format.tensors import TensorSpec
from . import layers
from .base import Algorithm, NewDraft, Proposer, Variant, register
from .reference import ChainDrafter

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


def _llama_config(cfg: dict[str, Any], attention_bias: bool):
    from transformers import LlamaConfig

    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "hidden_act", "rms_norm_eps", "max_position_embeddings", "mlp_bias")
    kwargs = {k: cfg[k] for k in keys if k in cfg}
    theta = cfg.get("rope_theta", 10000.0)
    c = LlamaConfig(**kwargs, attention_bias=attention_bias, rope_parameters={"rope_type": "default", "rope_theta": float(theta)})
    c._attn_implementation = "sdpa"
    return c


def eagle1_forward(
    tensors: dict[str, "torch.Tensor"],
    cfg: dict[str, Any],
    embeds: "torch.Tensor",
    verifier_hidden: "torch.Tensor",
    *,
    start: int = 0,
    cache: Any = None,
) -> "torch.Tensor":
    """Run an EAGLE-1 draft over one sequence, or over its positions after a KV cache.

    Args:
        tensors: the draft's tensors, in the research layout (``fc.bias`` allowed) or the
            specfmt one (attention biases); names ``fc.*`` and ``layers.{i}.*``.
        cfg: the decoder's Llama fields (``hidden_size``, heads, ``rope_theta`` ...).
        embeds: [T, H] token embeddings of the input ids (already shifted as EAGLE does).
        verifier_hidden: [T, H] the verifier's last hidden state (after its final norm).
        start: the position of the first row (the positions before it are in ``cache``).
        cache: a transformers ``DynamicCache`` holding positions ``[0, start)``, which this pass
            extends by its T positions; None for none (``start`` must then be 0).

    Returns:
        [T, H] the draft's output features, in the dtype and on the device of ``embeds``.

    Raises:
        KeyError: a tensor the layers need is missing.
    """
    import torch

    dev, dt = embeds.device, embeds.dtype
    layers, rope = _layers(tensors, cfg, dt, dev)
    x = torch.cat([embeds, verifier_hidden.to(dev, dt)], dim=-1) @ tensors["fc.weight"].to(dev, dt).T
    if "fc.bias" in tensors:
        x = x + tensors["fc.bias"].to(dev, dt)
    x = x.unsqueeze(0)
    T = x.shape[1]
    positions = torch.arange(start, start + T, device=dev).unsqueeze(0)
    # after a cache the mask is causal by position ([1, 1, T, start + T]; True = attend): sdpa's
    # is_causal would align the queries with the first keys
    mask = (torch.arange(start + T, device=dev)[None, :] <= positions[0][:, None])[None, None] if start else None
    cos_sin = rope(x, positions)
    with torch.no_grad():
        for layer in layers:
            out = layer(x, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=cache is not None,
                        position_embeddings=cos_sin)
            x = out[0] if isinstance(out, tuple) else out
    return x.squeeze(0)


def _layers(tensors: dict[str, "torch.Tensor"], cfg: dict[str, Any], dtype: Any, device: Any = None) -> tuple[list[Any], Any]:
    """The draft's transformers Llama layers with ``tensors`` loaded (layer 0's input norm an
    Identity), and the rotary embedding, in ``dtype`` on ``device``; built once per draft, dtype and device."""
    key = (id(tensors), str(dtype), str(device))
    hit = _BUILT.get(key)
    if hit is not None and hit[0] is tensors:
        return hit[1], hit[2]
    import torch
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    # q/k/v biases without an o_proj bias (EAGLE-Qwen2's qkv_bias) are a Llama layer with a zero o_proj bias
    attention_bias = any(n.endswith("_proj.bias") and ".self_attn." in n for n in tensors)
    config = _llama_config(cfg, attention_bias)
    n_layers = 1 + max(int(n.split(".")[1]) for n in tensors if n.startswith("layers."))
    layers = []
    for i in range(n_layers):
        layer = LlamaDecoderLayer(config, layer_idx=i).to(dtype)
        if i == 0:
            layer.input_layernorm = torch.nn.Identity()
        prefix = f"layers.{i}."
        state = {n[len(prefix):]: t.to(dtype) for n, t in tensors.items() if n.startswith(prefix) and "rotary_emb" not in n}
        if attention_bias:
            for p, mod in (("q", layer.self_attn.q_proj), ("k", layer.self_attn.k_proj), ("v", layer.self_attn.v_proj), ("o", layer.self_attn.o_proj)):
                state.setdefault(f"self_attn.{p}_proj.bias", torch.zeros(mod.out_features, dtype=dtype))
        layer.load_state_dict(state, strict=True)
        layers.append(layer.to(device).eval())
    rope = LlamaRotaryEmbedding(config).to(device, dtype)
    _BUILT.clear()  # one draft at a time: a proposer's chain reuses it, the next draft replaces it
    _BUILT[key] = (tensors, layers, rope)
    return layers, rope


#: the layers :func:`_layers` built last, by (id of the tensors, dtype)
_BUILT: dict[tuple[int, str], tuple[Any, list[Any], Any]] = {}


def eagle1_proposer(tensors: dict[str, "torch.Tensor"], cfg: dict[str, Any], lm_head: "torch.Tensor", embed: "torch.Tensor") -> "Proposer":
    """EAGLE-1 chain drafting (``cnets1.py``; vLLM ``EagleLlamaForCausalLM``) as a :data:`~specfmt.algorithms.base.Proposer`.

    Position j of the draft reads the embedding of token j+1 and the verifier's last hidden
    state at j (after its final norm); each drafted token's draft feature is fed back as the
    hidden state of the next position. Logits are ``lm_head(feature)`` with the verifier's
    head and no norm.

    The draft keeps a KV cache (transformers ``DynamicCache``) of the verified positions between
    calls on one sequence (:class:`~specfmt.algorithms.reference.DraftCache`): a call runs the
    positions verified since the last one, then one position per further drafted token.

    Args:
        tensors / cfg: the draft, as for :func:`eagle1_forward`.
        lm_head: [V, H] the verifier's head.
        embed: [V, H] the embedding the draft uses (its own copy, else the verifier's).
    """
    return _Eagle1Chain(tensors, cfg, lm_head, embed)


class _Eagle1Chain(ChainDrafter):
    """See :func:`eagle1_proposer`; the sequences of a round run one after another (transformers' layers)."""

    def __init__(self, tensors, cfg, lm_head, embed):
        super().__init__()
        self.tensors, self.cfg, self.lm_head, self.embed = tensors, cfg, lm_head, embed

    def propose_many(self, requests, k: int) -> list[list[int]]:
        return [self._propose(tokens, states, k, cache) for (tokens, states), cache in zip(requests, self.caches(requests))]

    def _propose(self, tokens: list[int], states, k: int, cache) -> list[int]:
        import torch
        from transformers import DynamicCache

        feats = states.hidden[-1]  # the draft runs where the verifier's states are, in their dtype
        dev, dtype = feats.device, feats.dtype
        head = self.lm_head.to(dev, dtype)
        n = len(tokens) - 1
        c = cache.reusable(tokens, states)
        kv = cache.state if c else DynamicCache()
        _keep_first(kv, c)

        def run(ids: list[int], hidden, start: int):
            e = self.embed[torch.tensor(ids, device=self.embed.device)].to(dev, dtype)
            return eagle1_forward(self.tensors, self.cfg, e, hidden, start=start, cache=kv)

        f = run(tokens[c + 1:], feats[c:n], c)
        out: list[int] = []
        for i in range(k):
            d = int((f[-1] @ head.T).argmax())
            out.append(d)
            if i + 1 < k:
                f = run([d], f[-1:], n + i)
        _keep_first(kv, n)  # the drafted positions are never kept
        cache.keep(tokens, kv)
        return out


def _keep_first(kv: Any, n: int) -> None:
    """Cut a transformers ``DynamicCache`` to its first ``n`` positions (``crop`` with a negative
    count: what transformers 4.56 and 5.x both read as "remove that many")."""
    extra = kv.get_seq_length() - n
    if extra > 0:
        kv.crop(-extra)


@lru_cache(maxsize=1)
def _module_class():
    """The EAGLE-1 draft ``nn.Module`` class, built on first use (importing specfmt never imports torch)."""
    import torch
    from torch import nn

    b = layers.blocks()
    Layer, Decoder = b.Layer, b.Decoder

    class Eagle1Draft(Decoder):
        """See :func:`draft_module`."""

        def __init__(self, cfg: dict[str, Any]):
            super().__init__()
            self.cfg = cfg
            H = cfg["hidden_size"]
            self.fc = nn.Linear(2 * H, H, bias=False)
            self.layers = nn.ModuleList([Layer(cfg, False, input_norm=i > 0) for i in range(cfg["num_hidden_layers"])])
            layers.set_windows(self.layers, cfg)
            self.embed_tokens = None
            self._init_rope(cfg)

        def forward(self, embeds, hidden, positions, past=None, mask=None):
            """[B, T, H] embeddings and verifier (or fed-back) features -> ``(features [B, T, H], kv)``."""
            if mask is None and not past:
                T = embeds.shape[1]
                mask = torch.ones(T, T, dtype=torch.bool, device=embeds.device).tril()
            past = past or [[] for _ in self.layers]
            x = self.fc(torch.cat([embeds, hidden], dim=-1))
            kv = []
            for i, layer in enumerate(self.layers):
                a, new = self._attend(layer.self_attn, layer.input_layernorm(x), positions, past[i], mask)
                kv.append(new)
                x = x + a
                x = x + layer.mlp(layer.post_attention_layernorm(x))
            return x, kv

    return Eagle1Draft


def draft_module(cfg: dict[str, Any], tensors: dict[str, "torch.Tensor"] | None = None):
    """The EAGLE-1/2 (and HASS) draft as a trainable ``torch.nn.Module`` with specfmt tensor names.

    The forward pass of :func:`eagle1_forward` (``cnets1.py``; vLLM ``llama_eagle.py``) over a
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
    return layers.load_state(_module_class()(cfg), tensors)


def eagle1_loss(draft, embed: "torch.Tensor", head: Callable, ids: "torch.Tensor", last: "torch.Tensor", noise: float = 0.0,
                generator: "torch.Generator | None" = None):
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
    loss = F.smooth_l1_loss(f.float(), target.float()) + 0.1 * -(p * logits.log_softmax(-1)).sum(-1).mean()
    correct = int((logits.argmax(-1) == p.argmax(-1)).sum())
    return loss, [correct], [p.shape[0] * p.shape[1]]


@register
class Eagle(Algorithm):
    config = EagleConfig
    name = EagleConfig.name
    title = "EAGLE-1/2"
    vllm_method = "eagle"
    train_summary = "Train an EAGLE-1/2 draft (feature regression + 0.1 x token loss) against the frozen verifier."
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

    def new_config(self, verifier: "Verifier", shape: NewDraft) -> dict[str, Any]:
        info = verifier.info
        tlc = layers.decoder_config(layers.verifier_decoder_fields(verifier.text_config), info.hidden_size,
                                    verifier.text_config["num_attention_heads"], info.vocab_size, info, DTYPE_CODES[shape.dtype], shape.layers)
        return build_config(info, tlc, speculative_tokens=self.default_speculative_tokens(shape))

    def module(self, cfg: dict[str, Any], tensors: dict[str, "torch.Tensor"] | None = None):
        return draft_module(cfg, tensors)

    def proposer(self, reading: Variant, tensors: dict[str, "torch.Tensor"], embed: "torch.Tensor", lm_head: "torch.Tensor") -> Proposer:
        return eagle1_proposer(tensors, reading.cfg, lm_head, tensors.get("embed_tokens.weight", embed))

    def loss(self, module: Any, *, embed: Any, head: Any, ids: Any, aux: Any, last: Any, ttt_steps: int, noise: float,
             generator: Any, subset: list[int] | None, normaliser: Any = None):
        return eagle1_loss(module, embed, head, ids, last, noise, generator)

    def new_draft(self, cfg: dict[str, Any], verifier: "Verifier", docs: list[list[int]] | None):
        tensors = {n: t.detach().clone() for n, t in draft_module(cfg).state_dict().items()}
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
