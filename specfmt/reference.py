"""Reference draft forward passes in plain PyTorch, built on transformers' Llama layers.

These are the research forward passes, not vLLM's: they are what a converted
checkpoint is checked against. Single sequence, no KV cache, any dtype (use
float64 to compare two weight layouts of the same function).

EAGLE-1/2 and HASS (SafeAILab/EAGLE ``eagle/model/cnets1.py`` ``Model.forward``;
``research-formats.md`` §2.4)::

    x = fc(cat([embed(ids), h_verifier], -1))        # fc.bias when present
    x = layer_0(x)                                   # Llama layer, input norm = Identity
    x = layer_i(x)  for i >= 1                       # standard pre-norm Llama layers
    return x                                          # fed to the verifier's lm_head

The layers are ``transformers.models.llama.modeling_llama.LlamaDecoderLayer`` with
``attention_bias`` as the weights require, SDPA attention (causal, in the input dtype)
and the Llama rotary embedding from the same config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .acceptance import Proposer


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
) -> "torch.Tensor":
    """Run an EAGLE-1 draft over one sequence.

    Args:
        tensors: the draft's tensors, in the research layout (``fc.bias`` allowed) or the
            specfmt one (attention biases); names ``fc.*`` and ``layers.{i}.*``.
        cfg: the decoder's Llama fields (``hidden_size``, heads, ``rope_theta`` ...).
        embeds: [T, H] token embeddings of the input ids (already shifted as EAGLE does).
        verifier_hidden: [T, H] the verifier's last hidden state (after its final norm).

    Returns:
        [T, H] the draft's output features, in the dtype of ``embeds``.

    Raises:
        KeyError: a tensor the layers need is missing.
    """
    import torch
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    dtype = embeds.dtype
    # q/k/v biases without an o_proj bias (EAGLE-Qwen2's qkv_bias) are a Llama layer with a zero o_proj bias
    attention_bias = any(n.endswith("_proj.bias") and ".self_attn." in n for n in tensors)
    config = _llama_config(cfg, attention_bias)
    n_layers = 1 + max(int(n.split(".")[1]) for n in tensors if n.startswith("layers."))
    x = torch.cat([embeds, verifier_hidden], dim=-1) @ tensors["fc.weight"].to(dtype).T
    if "fc.bias" in tensors:
        x = x + tensors["fc.bias"].to(dtype)
    x = x.unsqueeze(0)
    positions = torch.arange(x.shape[1]).unsqueeze(0)
    rope = LlamaRotaryEmbedding(config).to(dtype)
    cos_sin = rope(x, positions)
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
        layer.eval()
        with torch.no_grad():
            out = layer(x, attention_mask=None, position_ids=positions, position_embeddings=cos_sin)
        x = out[0] if isinstance(out, tuple) else out
    return x.squeeze(0)




def eagle1_proposer(tensors: dict[str, "torch.Tensor"], cfg: dict[str, Any], lm_head: "torch.Tensor", embed: "torch.Tensor") -> "Proposer":
    """EAGLE-1 chain drafting (``cnets1.py``; vLLM ``EagleLlamaForCausalLM``) as a :data:`~specfmt.acceptance.Proposer`.

    Position j of the draft reads the embedding of token j+1 and the verifier's last hidden
    state at j (after its final norm); each drafted token's draft feature is fed back as the
    hidden state of the next position. Logits are ``lm_head(feature)`` with the verifier's
    head and no norm.

    Args:
        tensors / cfg: the draft, as for :func:`eagle1_forward`.
        lm_head: [V, H] the verifier's head.
        embed: [V, H] the embedding the draft uses (its own copy, else the verifier's).
    """
    import torch

    def propose(tokens: list[int], states, k: int) -> list[int]:
        dtype = states.hidden[-1].dtype
        ids = list(tokens[1:])
        feats = states.hidden[-1]
        out: list[int] = []
        for _ in range(k):
            f = eagle1_forward(tensors, cfg, embed[torch.tensor(ids)].to(dtype), feats)
            d = int((f[-1] @ lm_head.to(dtype).T).argmax())
            out.append(d)
            ids.append(d)
            feats = torch.cat([feats, f[-1:]], dim=0)
        return out

    return propose


def medusa_proposer(tensors: dict[str, "torch.Tensor"], cfg: dict[str, Any]) -> "Proposer":
    """Medusa heads (``medusa_model.py``; vLLM ``Medusa``) as a :data:`~specfmt.acceptance.Proposer`.

    Head i reads the verifier's last hidden state (after its final norm) at the position
    that produced the newest token x, applies its L blocks ``x + SiLU(W x + b)`` and its
    head (``lm_heads.{i}``, or the shared ``lm_head`` with ``original_lm_head``), and
    proposes the token i+1 places after x.

    Args:
        tensors: specfmt Medusa tensors (``blocks.{i}.layers.{j}.*``, ``lm_heads.{i}.weight``).
        cfg: the specfmt config (``num_heads``, ``num_hidden_layers``, ``original_lm_head``).
    """
    import torch

    def propose(tokens: list[int], states, k: int) -> list[int]:
        h0 = states.hidden[-1][-1]
        out = []
        for i in range(k):
            x = h0
            for j in range(cfg["num_hidden_layers"]):
                w = tensors[f"blocks.{i}.layers.{j}.weight"].to(x.dtype)
                b = tensors.get(f"blocks.{i}.layers.{j}.bias")
                y = x @ w.T + (b.to(x.dtype) if b is not None else 0)
                x = x + torch.nn.functional.silu(y)
            head = tensors["lm_head.weight"] if cfg["original_lm_head"] else tensors[f"lm_heads.{i}.weight"]
            out.append(int((x @ head.to(x.dtype).T).argmax()))
        return out

    return propose


__all__ = ["Eagle1Draft", "Eagle3Draft", "MedusaHeads", "eagle1_forward", "eagle1_proposer", "eagle3_proposer", "medusa_proposer"]


# --------------------------------------------------------------------------- EAGLE-3


def _rms_norm(x: "torch.Tensor", weight: "torch.Tensor", eps: float) -> "torch.Tensor":
    """Llama RMSNorm (computed in float32 or wider, as transformers' ``LlamaRMSNorm``)."""
    import torch

    wide = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
    return weight * wide.to(x.dtype)


def _new_module():
    """A ``torch.nn.Module`` subclass built lazily, so importing this module does not import torch."""
    import torch
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self, n: int, eps: float):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))
            self.eps = eps

        def forward(self, x):
            return _rms_norm(x, self.weight, self.eps)

    class Attention(nn.Module):
        def __init__(self, in_width: int, H: int, nH: int, nKV: int, hd: int, bias: bool):
            super().__init__()
            self.nH, self.nKV, self.hd = nH, nKV, hd
            self.q_proj = nn.Linear(in_width, nH * hd, bias=bias)
            self.k_proj = nn.Linear(in_width, nKV * hd, bias=bias)
            self.v_proj = nn.Linear(in_width, nKV * hd, bias=bias)
            self.o_proj = nn.Linear(nH * hd, H, bias=bias)

    class MLP(nn.Module):
        def __init__(self, H: int, inter: int, bias: bool):
            super().__init__()
            self.gate_proj = nn.Linear(H, inter, bias=bias)
            self.up_proj = nn.Linear(H, inter, bias=bias)
            self.down_proj = nn.Linear(inter, H, bias=bias)

        def forward(self, x):
            return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self, tlc: dict[str, Any], first: bool, input_norm: bool = True):
            super().__init__()
            H, eps = tlc["hidden_size"], tlc.get("rms_norm_eps", 1e-6)
            nH, nKV = tlc["num_attention_heads"], tlc.get("num_key_value_heads") or tlc["num_attention_heads"]
            hd = tlc.get("head_dim") or H // nH
            self.first = first
            self.self_attn = Attention(2 * H if first else H, H, nH, nKV, hd, bool(tlc.get("attention_bias")))
            self.mlp = MLP(H, tlc["intermediate_size"], bool(tlc.get("mlp_bias")))
            self.input_layernorm = RMSNorm(H, eps) if input_norm else nn.Identity()
            if first:
                self.hidden_norm = RMSNorm(H, eps)
            self.post_attention_layernorm = RMSNorm(H, eps)

    class Decoder(nn.Module):
        """Rotary embedding and attention shared by the EAGLE drafts (transformers' Llama conventions)."""

        def _init_rope(self, tlc: dict[str, Any]) -> None:
            H = tlc["hidden_size"]
            hd = tlc.get("head_dim") or H // tlc["num_attention_heads"]
            theta = float((tlc.get("rope_parameters") or {}).get("rope_theta", tlc.get("rope_theta", 10000.0)))
            self.register_buffer("inv_freq", 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)), persistent=False)

        def _rope(self, x, positions):
            # x [B, n, T, hd]; rotate_half convention of transformers' Llama
            freqs = positions.to(torch.float64)[:, None] * self.inv_freq[None, :]
            emb = torch.cat([freqs, freqs], dim=-1)
            cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
            half = x.shape[-1] // 2
            rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
            return x * cos + rot * sin

        def _attend(self, attn, x, positions, past, mask):
            B, T, _ = x.shape
            q = attn.q_proj(x).view(B, T, attn.nH, attn.hd).transpose(1, 2)
            k = attn.k_proj(x).view(B, T, attn.nKV, attn.hd).transpose(1, 2)
            v = attn.v_proj(x).view(B, T, attn.nKV, attn.hd).transpose(1, 2)
            q, k = self._rope(q, positions), self._rope(k, positions)
            keys = torch.cat([p[0] for p in past] + [k], dim=2)
            vals = torch.cat([p[1] for p in past] + [v], dim=2)
            rep = attn.nH // attn.nKV
            o = nn.functional.scaled_dot_product_attention(q, keys.repeat_interleave(rep, 1), vals.repeat_interleave(rep, 1), attn_mask=mask)
            return attn.o_proj(o.transpose(1, 2).reshape(B, T, attn.nH * attn.hd)), (k, v)

    class Eagle3Draft(Decoder):
        """See :class:`specfmt.reference.Eagle3Draft`."""

        def __init__(self, cfg: dict[str, Any]):
            super().__init__()
            tlc = cfg["transformer_layer_config"]
            self.cfg = cfg
            H = tlc["hidden_size"]
            Ht = cfg.get("target_hidden_size") or H
            n_aux = len(cfg["eagle_aux_hidden_state_layer_ids"])
            eps = tlc["rms_norm_eps"]
            self.eps = eps
            self.taps = list(cfg["eagle_aux_hidden_state_layer_ids"])
            self.norm_before_residual = bool(cfg.get("norm_before_residual"))
            self.norm_output = bool(cfg.get("norm_output"))
            if cfg.get("norm_before_fc"):
                self.input_norm = RMSNorm(n_aux * Ht, eps)
            if cfg.get("fc_norm"):
                self.fc_norm = nn.ModuleList([RMSNorm(Ht, eps) for _ in range(n_aux)])
            self.fc = nn.Linear(n_aux * Ht, H, bias=False)
            self.layers = nn.ModuleList([Layer(tlc, i == 0) for i in range(tlc["num_hidden_layers"])])
            self.norm = RMSNorm(H, eps)
            V, Vd = tlc["vocab_size"], cfg["draft_vocab_size"]
            self.lm_head = nn.Linear(H, Vd, bias=False)
            if Vd != V:
                self.register_buffer("d2t", torch.zeros(Vd, dtype=torch.long))
                self.register_buffer("t2d", torch.zeros(V, dtype=torch.bool))
            self.embed_tokens = None
            self._init_rope(tlc)

        # -- pieces ---------------------------------------------------------
        def combine(self, aux: "torch.Tensor") -> "torch.Tensor":
            """[..., n_aux·H_t] verifier tap states -> [..., H] (``combine_hidden_states``)."""
            if hasattr(self, "input_norm"):
                aux = self.input_norm(aux)
            if hasattr(self, "fc_norm"):
                chunks = aux.chunk(len(self.fc_norm), dim=-1)
                aux = torch.cat([n(c) for n, c in zip(self.fc_norm, chunks)], dim=-1)
            return self.fc(aux)

        def target_ids(self) -> "torch.Tensor":
            """[Vd] verifier id of each draft id: ``i + d2t[i]`` (EAGLE-3 ``cnets.py``; vLLM ``compute_logits``)."""
            base = torch.arange(self.lm_head.out_features, device=self.lm_head.weight.device)
            return base + self.d2t if hasattr(self, "d2t") else base

        def forward(self, embeds, hidden, positions, past=None, mask=None):
            """One draft pass.

            Args:
                embeds: [B, T, H] token embeddings (of the token after each position).
                hidden: [B, T, H] per position: ``combine(taps)`` for verified positions, the
                    draft's own fed-back state for drafted ones.
                positions: [T] rotary positions.
                past: per layer, a list of (k, v) [B, n_kv, T', hd] from earlier passes that
                    these queries may also attend to (training-time test); None for none.
                mask: [T, T'+T] boolean attention mask (True = attend); None = causal.

            Returns:
                ``(logits [B, T, Vd], feedback [B, T, H], kv)``: draft-vocabulary logits, the
                state fed back for the next drafted position (the pre-norm output, or the
                normed one with ``norm_output``), and this pass's (k, v) per layer.
            """
            if mask is None and not past:
                T = embeds.shape[1]
                mask = torch.ones(T, T, dtype=torch.bool, device=embeds.device).tril()
            past = past or [[] for _ in self.layers]
            kv = []
            x = hidden
            for i, layer in enumerate(self.layers):
                if layer.first:
                    e = layer.input_layernorm(embeds)
                    if self.norm_before_residual:
                        x = layer.hidden_norm(x)
                        residual = x
                    else:
                        residual = x
                        x = layer.hidden_norm(x)
                    x = torch.cat([e, x], dim=-1)
                else:
                    residual = x
                    x = layer.input_layernorm(x)
                a, new = self._attend(layer.self_attn, x, positions, past[i], mask)
                kv.append(new)
                x = residual + a
                x = x + layer.mlp(layer.post_attention_layernorm(x))
            normed = self.norm(x)
            return self.lm_head(normed), (normed if self.norm_output else x), kv

    class Eagle1Draft(Decoder):
        """See :func:`specfmt.reference.Eagle1Draft`."""

        def __init__(self, cfg: dict[str, Any]):
            super().__init__()
            self.cfg = cfg
            H = cfg["hidden_size"]
            self.fc = nn.Linear(2 * H, H, bias=False)
            self.layers = nn.ModuleList([Layer(cfg, False, input_norm=i > 0) for i in range(cfg["num_hidden_layers"])])
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

    class MedusaHeads(nn.Module):
        """See :func:`specfmt.reference.MedusaHeads`."""

        def __init__(self, cfg: dict[str, Any]):
            super().__init__()
            self.cfg = cfg
            H, V, K, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_heads"], cfg["num_hidden_layers"]
            bias = bool(cfg["medusa_fc_bias"])
            self.blocks = nn.ModuleList()
            for _ in range(K):
                block = nn.Module()
                block.layers = nn.ModuleList([nn.Linear(H, H, bias=bias) for _ in range(L)])
                self.blocks.append(block)
            if cfg["original_lm_head"]:
                self.lm_head = nn.Linear(H, V, bias=False)
            else:
                self.lm_heads = nn.ModuleList([nn.Linear(H, V, bias=False) for _ in range(K)])

        def head(self, i: int, h):
            """Head i on [..., H] verifier features -> [..., V] logits of the token i+2 places ahead."""
            x = h
            for lin in self.blocks[i].layers:
                x = x + nn.functional.silu(lin(x))
            return (self.lm_head if hasattr(self, "lm_head") else self.lm_heads[i])(x)

        def forward(self, h):
            """[..., H] -> [K, ..., V]: every head's logits."""
            return torch.stack([self.head(i, h) for i in range(len(self.blocks))])

    return {"eagle3": Eagle3Draft, "eagle": Eagle1Draft, "medusa": MedusaHeads}


_MODULES: dict[str, Any] = {}


def _module_class(algorithm: str):
    if not _MODULES:
        _MODULES.update(_new_module())
    return _MODULES[algorithm]


def _load(model, tensors: dict[str, "torch.Tensor"] | None):
    """Load ``tensors`` (strict; ``embed_tokens.weight`` kept aside as ``model.embed_tokens``)."""
    if tensors is not None:
        own = model.state_dict()
        state = {n: t.to(own[n].dtype) if n in own else t for n, t in tensors.items() if n != "embed_tokens.weight"}
        model.load_state_dict(state, strict=True)
        model.embed_tokens = tensors.get("embed_tokens.weight")
    return model


def Eagle3Draft(cfg: dict[str, Any], tensors: dict[str, "torch.Tensor"] | None = None):
    """The EAGLE-3 draft as a ``torch.nn.Module``, with its state-dict names the specfmt tensor names.

    The forward pass of vLLM's ``llama_eagle3.py`` and SafeAILab ``eagle/traineagle3/cnets.py``
    (layer 0 reads ``cat(input_layernorm(embed), hidden_norm(h))``, 2H wide; residual = h,
    or the normed h with ``norm_before_residual``), with every variant the format allows:
    ``norm_before_fc`` (one RMSNorm over the n_aux·H_t taps, ``input_norm.weight``),
    ``fc_norm`` (one RMSNorm per tap, ``fc_norm.{i}.weight``), ``norm_output`` (the normed
    output is fed back instead of the pre-norm one), ``d2t`` (draft id i proposes verifier id
    ``i + d2t[i]``) and layers ≥ 1 as plain pre-norm Llama layers.

    Args:
        cfg: a specfmt eagle3 ``config.json`` (dict).
        tensors: the checkpoint's tensors; None leaves the module randomly initialised
            (``nn.Linear`` defaults, norms = 1). ``embed_tokens.weight`` is kept as the
            attribute ``embed_tokens`` (a tensor, not a parameter) when present.

    Raises:
        KeyError / RuntimeError: ``tensors`` lack a tensor the config implies or have a
            different shape (``load_state_dict(strict=True)``).
    """
    return _load(_module_class("eagle3")(cfg), tensors)


def Eagle1Draft(cfg: dict[str, Any], tensors: dict[str, "torch.Tensor"] | None = None):
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
    return _load(_module_class("eagle")(cfg), tensors)


def MedusaHeads(cfg: dict[str, Any], tensors: dict[str, "torch.Tensor"] | None = None):
    """K Medusa heads (``medusa_model.py`` ``ResBlock``; vLLM ``medusa.py``) as a trainable module.

    Head i maps the verifier's last hidden state h [..., H] through L blocks
    ``x + SiLU(W x + b)`` and its head [V, H] (``lm_heads.{i}``, or the shared ``lm_head``
    with ``original_lm_head``) to the logits of the token i+2 places after the one h predicts.

    Args:
        cfg: a specfmt medusa ``config.json``.
        tensors: ``blocks.{i}.layers.{j}.*`` and the heads, or None for a random initialisation.

    Raises:
        KeyError / RuntimeError: ``tensors`` do not fit the config.
    """
    return _load(_module_class("medusa")(cfg), tensors)


def eagle3_proposer(draft, embed: "torch.Tensor", dtype=None, targets: "torch.Tensor | None" = None) -> "Proposer":
    """EAGLE-3 chain drafting (vLLM ``EagleProposer`` with ``Eagle3LlamaForCausalLM``) as a :data:`~specfmt.acceptance.Proposer`.

    Position j of the draft reads the embedding of token j+1 and ``combine`` of the verifier's
    tap states at j (``hidden[l]`` for each tap id l: the residual stream entering layer l);
    each drafted position reads the draft's fed-back state of the position before it. The
    proposed verifier id is ``target_ids()[argmax(draft logits)]``.

    Args:
        draft: an :func:`Eagle3Draft` (eval mode).
        embed: [V, H] the embedding the draft uses: its own ``embed_tokens`` when the
            checkpoint has one, else the verifier's (vLLM shares it).
        dtype: compute dtype (default: the verifier states' dtype).
        targets: [Vd] verifier id of each draft id (default ``draft.target_ids()``, the
            format's reading of ``d2t``); validation passes other readings to test them.
    """
    import torch

    targets = draft.target_ids() if targets is None else targets

    def propose(tokens: list[int], states, k: int) -> list[int]:
        dt = dtype or states.hidden[0].dtype
        d = draft.to(dt)
        aux = torch.cat([states.hidden[j] for j in d.taps], dim=-1).to(dt)
        with torch.no_grad():
            hidden = d.combine(aux)[None]
            ids = list(tokens[1:])
            out: list[int] = []
            for _ in range(k):
                e = embed[torch.tensor(ids)].to(dt)[None]
                logits, feedback, _ = d(e, hidden, torch.arange(len(ids)))
                t = int(targets[int(logits[0, -1].argmax())])
                out.append(t)
                ids.append(t)
                hidden = torch.cat([hidden, feedback[:, -1:]], dim=1)
        return out

    return propose
