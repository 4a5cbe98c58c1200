"""Fill-ins without training: the tensors a draft lacks that can be computed exactly.

* ``d2t``/``t2d`` of an EAGLE-3 draft from token frequencies over a corpus
  (:func:`specfmt.train_data.vocab_map`, the reference's ``scandata``);
* ``embed_tokens.weight`` of an EAGLE-3 (H = H_t) or EAGLE-1 draft: the verifier's
  embedding, which the draft was trained with (EAGLE freezes it);
* Medusa ``lm_heads.{i}.weight``: copies of the verifier's ``lm_head``, which is how the
  Medusa trainer initialises them (``medusa_model.py``: ``lm_head.weight.data[:] =
  base_model.lm_head.weight.data[:]``), turning ``original_lm_head`` heads into per-head
  ones that training can specialise; new Medusa heads (blocks zero, so a new head first
  proposes what the verifier's head does);
* an EAGLE-3 ``lm_head`` [Vd, H] for a new draft: the verifier's head rows of the draft
  vocabulary (``t2d``).

Each function changes the :class:`~specfmt.draft.Draft` in place and returns
``{tensor name: how}`` for the provenance block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .draft import Draft

EMBED_NAMES = ["model.embed_tokens.weight", "model.language_model.embed_tokens.weight", "embed_tokens.weight"]
HEAD_NAMES = ["lm_head.weight", "language_model.lm_head.weight"]


def verifier_tensor(verifier: str, what: str, tied: bool = False) -> "torch.Tensor":
    """The verifier's input embedding (``what="embed"``) or ``lm_head`` [V, H_t], read alone from its weights.

    Raises:
        InputError, HubError: the verifier's weights cannot be read or lack the tensor.
    """
    from .convert import open_verifier_tensor

    names = EMBED_NAMES if what == "embed" else HEAD_NAMES + (EMBED_NAMES if tied else [])
    reader, name = open_verifier_tensor(verifier, names)
    with reader:
        return reader.get(name).clone()


def fill_vocab_map(draft: "Draft", docs: list[list[int]]) -> dict[str, str]:
    """``d2t``/``t2d`` of an EAGLE-3 draft with Vd < V that lacks them.

    Raises:
        InputError: the draft is not EAGLE-3, already has a map, or the data is too small.
    """
    from .train_data import vocab_map

    cfg = draft.config
    if draft.algorithm != "eagle3":
        raise InputError(f"a {draft.algorithm} draft has no draft vocabulary map", hint="only EAGLE-3 drafts use d2t/t2d")
    V, Vd = cfg["transformer_layer_config"]["vocab_size"], cfg["draft_vocab_size"]
    if Vd == V:
        raise InputError("the draft's vocabulary is the verifier's (Vd = V): it needs no d2t/t2d")
    if "d2t" in draft.tensors:
        raise InputError("the draft already has d2t/t2d", hint="drop --vocab-map to keep them")
    d2t, t2d, coverage = vocab_map(docs, V, Vd)
    draft.tensors["d2t"], draft.tensors["t2d"] = d2t, t2d
    how = f"top {Vd} token ids by frequency over the training data, covering {coverage:.1%} of its positions (cnets.py scandata)"
    return {"d2t": how, "t2d": how}


def fill_embed(draft: "Draft", verifier: str) -> dict[str, str]:
    """Copy the verifier's embedding into ``embed_tokens.weight`` (EAGLE-3 with H = H_t, EAGLE-1).

    Raises:
        InputError: a Medusa draft, an EAGLE-3 draft narrower than the verifier (its
            embedding must be trained, not copied), or an embedding already present.
    """
    cfg = draft.config
    if draft.algorithm == "medusa":
        raise InputError("Medusa heads read the verifier's hidden state, not token embeddings")
    if "embed_tokens.weight" in draft.tensors:
        raise InputError("the draft already has embed_tokens.weight")
    H = cfg["transformer_layer_config"]["hidden_size"]
    if draft.algorithm == "eagle3" and (cfg.get("target_hidden_size") or H) != H:
        raise InputError(f"the draft is {H} wide and the verifier {cfg['target_hidden_size']}: the verifier's embedding cannot be copied",
                         hint="such a draft's embedding is trained with it")
    embed = verifier_tensor(verifier, "embed")
    if tuple(embed.shape) != (cfg["transformer_layer_config"]["vocab_size"], H):
        raise InputError(f"the verifier's embedding is {list(embed.shape)}, the draft needs [{cfg['transformer_layer_config']['vocab_size']}, {H}]")
    draft.tensors["embed_tokens.weight"] = embed
    return {"embed_tokens.weight": "the verifier's input embedding, copied"}


def fill_medusa_lm_heads(draft: "Draft", verifier: str, heads: int | None = None) -> dict[str, str]:
    """Give every Medusa head its own ``lm_heads.{i}.weight`` and add heads up to ``heads``.

    Shared-head drafts (``original_lm_head``) get per-head copies of the shared head;
    new heads get zero blocks (biases zero) and a copy of the verifier's ``lm_head``.

    Raises:
        InputError: not a Medusa draft, or ``heads`` fewer than the draft has.
    """
    import torch

    cfg = draft.config
    if draft.algorithm != "medusa":
        raise InputError(f"a {draft.algorithm} draft has no Medusa heads")
    K, L, H = cfg["num_heads"], cfg["num_hidden_layers"], cfg["hidden_size"]
    heads = heads or K
    if heads < K:
        raise InputError(f"--heads {heads}: the draft already has {K} heads", hint="heads are only added, never removed")
    how: dict[str, str] = {}
    if cfg["original_lm_head"]:
        shared = draft.tensors.pop("lm_head.weight")
        for i in range(K):
            draft.tensors[f"lm_heads.{i}.weight"] = shared.clone()
            how[f"lm_heads.{i}.weight"] = "the shared lm_head.weight, copied (original_lm_head -> per-head heads)"
    base = None
    for i in range(K, heads):
        if base is None:
            base = verifier_tensor(verifier, "head", tied=verifier_is_tied(verifier))
        dtype = next(t.dtype for n, t in draft.tensors.items() if n.startswith("blocks."))
        for j in range(L):
            draft.tensors[f"blocks.{i}.layers.{j}.weight"] = torch.zeros(H, H, dtype=dtype)
            how[f"blocks.{i}.layers.{j}.weight"] = "new head: zeros (Medusa ResBlock init)"
            if cfg["medusa_fc_bias"]:
                draft.tensors[f"blocks.{i}.layers.{j}.bias"] = torch.zeros(H, dtype=dtype)
                how[f"blocks.{i}.layers.{j}.bias"] = "new head: zeros"
        draft.tensors[f"lm_heads.{i}.weight"] = base.clone()
        how[f"lm_heads.{i}.weight"] = "new head: the verifier's lm_head, copied"
    for block in (cfg, cfg["transformer_layer_config"]):
        block["num_heads"] = heads
        block["original_lm_head"] = False
    return how


def fill_eagle3_head(draft: "Draft", verifier: str) -> dict[str, str]:
    """Initialise a new EAGLE-3 draft's ``lm_head`` [Vd, H] from the verifier's head rows ``t2d``.

    Raises:
        InputError: the draft is narrower than the verifier (the rows do not fit).
    """
    cfg = draft.config
    H = cfg["transformer_layer_config"]["hidden_size"]
    head = verifier_tensor(verifier, "head", tied=verifier_is_tied(verifier))
    if head.shape[1] != H:
        raise InputError(f"the verifier's lm_head is {head.shape[1]} wide, the draft {H}: it cannot start from it")
    rows = draft.tensors["t2d"].nonzero().squeeze(1) if "t2d" in draft.tensors else slice(None)
    draft.tensors["lm_head.weight"] = head[rows].clone()
    return {"lm_head.weight": "the verifier's lm_head rows of the draft vocabulary (t2d), as a starting point"}


def verifier_is_tied(verifier: str) -> bool:
    """The verifier's ``lm_head`` is its input embedding (``tie_word_embeddings``)."""
    from .draft import verifier_config

    return verifier_config(verifier)[0].tie_word_embeddings


__all__ = ["fill_eagle3_head", "fill_embed", "fill_medusa_lm_heads", "fill_vocab_map", "verifier_is_tied", "verifier_tensor"]
