"""A draft in memory: its specfmt config and tensors, read from any source and written atomically.

The trainer's unit of work. :func:`load_draft` reads a specfmt folder directly, and a
research checkpoint through its converter (the same plan ``specfmt convert`` runs, with
only the tensors :func:`specfmt.fill` can compute allowed to be missing);
:func:`new_config` builds the config of a draft trained from scratch for a verifier; and
:func:`save_draft` writes the result the way ``convert`` does: schema and tensor inventory
checked first, then a temporary folder renamed into place, so OUT is never half-written.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InputError
from .format import CONFIG_FILE, WEIGHTS_FILE, read_json, validate_config

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .format import VerifierInfo

#: tensors a research checkpoint may lack and ``specfmt train fill`` computes
FILLABLE = frozenset({"d2t", "t2d"})


@dataclass
class Draft:
    """A draft checkpoint in memory.

    Attributes:
        config: the specfmt ``config.json`` (schema-valid).
        tensors: specfmt tensor names -> tensors (CPU).
        source: the provenance ``source`` block of where it was read from (None: new).
        notes: what reading it did that the user should know.
    """

    config: dict[str, Any]
    tensors: dict[str, "torch.Tensor"]
    source: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def algorithm(self) -> str:
        return self.config["speculators_model_type"]


def is_specfmt_folder(folder: Path) -> bool:
    """A folder written by specfmt: a config with the ``specfmt`` provenance block and ``model.safetensors``."""
    cfg_path = folder / CONFIG_FILE
    if not cfg_path.is_file() or not (folder / WEIGHTS_FILE).is_file():
        return False
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and isinstance(cfg.get("specfmt"), dict) and "speculators_model_type" in cfg


def load_draft(ref: str, *, source_format: str = "auto", verifier: str | None = None, revision: str | None = None) -> Draft:
    """Read a draft into memory, converting a research checkpoint on the way.

    Args:
        ref: a specfmt folder, or a research checkpoint (folder or Hub id).
        source_format: the ``--from`` name of a research checkpoint, ``auto`` to detect it,
            or ``specfmt``; a specfmt folder is read as such under ``auto``.
        verifier: the verifier (needed for a research checkpoint, as for ``convert``).
        revision: Hub revision of ``ref``.

    Raises:
        InputError, HubError: ``ref`` cannot be read.
        ConversionError: the research checkpoint cannot be converted exactly (tensors in
            :data:`FILLABLE` aside, which may be missing).
        ConfigSchemaError: a specfmt folder's config is invalid.
    """
    from safetensors.torch import load_file

    from .hub import resolve

    local = Path(ref).expanduser()
    if source_format == "specfmt" or (source_format == "auto" and is_specfmt_folder(local)):
        if not is_specfmt_folder(local):
            raise InputError(f"{ref} is not a specfmt folder (config.json with a specfmt block, model.safetensors)",
                             hint="give a research checkpoint with --from FORMAT")
        cfg = read_json(local / CONFIG_FILE)
        validate_config(cfg, where=str(local / CONFIG_FILE))
        return Draft(cfg, load_file(str(local / WEIGHTS_FILE)), (cfg.get("specfmt") or {}).get("source"))
    if verifier is None:
        raise InputError(f"{ref} is a research checkpoint; reading it needs the verifier", hint="pass --verifier")
    from .convert import convert

    resolve(ref, allow_patterns=["*.json"], revision=revision, what="source")  # a clear error before the temp folder
    tmp = Path(tempfile.mkdtemp(prefix="specfmt-draft-"))
    try:
        res = convert(source_format, ref, tmp / "draft", verifier, revision=revision, allow_missing=FILLABLE)
        cfg = read_json(res.out / CONFIG_FILE)
        tensors = load_file(str(res.out / WEIGHTS_FILE))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Draft(cfg, tensors, cfg["specfmt"]["source"], list(res.plan.notes))


def verifier_config(ref: str) -> tuple["VerifierInfo", dict[str, Any]]:
    """The verifier's :class:`~specfmt.format.VerifierInfo` and its raw text config.

    Raises:
        InputError, HubError: the verifier's config.json cannot be found or read.
    """
    from .convert import load_verifier
    from .hub import resolve

    info = load_verifier(ref)
    raw = read_json(resolve(ref, allow_patterns=["config.json"], what="verifier").folder / CONFIG_FILE)
    return info, raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw


def new_config(algorithm: str, verifier: str, *, draft_vocab: int | None = None, taps: list[int] | None = None, layers: int = 1,
               heads: int = 3, head_layers: int = 1, speculative_tokens: int | None = None, dtype: str = "float32") -> dict[str, Any]:
    """The specfmt config of a new draft for ``verifier``, its decoder shaped like one verifier layer.

    Args:
        algorithm: ``eagle3``, ``eagle`` or ``medusa``.
        verifier: folder or Hub id.
        draft_vocab: EAGLE-3 draft vocabulary Vd (default: the verifier's V).
        taps: EAGLE-3 tap layer ids (default: the reference's (2, N//2, N-3)).
        layers: EAGLE decoder layers.
        heads / head_layers: Medusa heads K and residual blocks per head L.
        speculative_tokens: k (default 3; Medusa: K).
        dtype: the floating dtype the tensors will be saved in.

    Raises:
        InputError: an option does not fit the verifier.
    """
    from specfmt.converters.base import DTYPE_CODES, llama_decoder_config, speculators_block

    from .format import SPECULATORS_VERSION, default_eagle3_taps

    info, vcfg = verifier_config(verifier)
    H, V, N = info.hidden_size, info.vocab_size, info.num_hidden_layers
    code = DTYPE_CODES[dtype]
    k = speculative_tokens or (heads if algorithm == "medusa" else 3)
    if algorithm == "medusa":
        if k > heads:
            raise InputError(f"--speculative-tokens {k} is more than the {heads} Medusa heads")
        native = {"model_type": "medusa", "hidden_size": H, "vocab_size": V, "num_heads": heads, "num_hidden_layers": head_layers,
                  "medusa_fc_bias": True, "original_lm_head": False}
        return {"architectures": ["MedusaModel"], **native, "truncated_vocab_size": V, "speculators_model_type": "medusa",
                "speculators_version": SPECULATORS_VERSION, "speculators_config": speculators_block("medusa", k, info),
                "transformer_layer_config": dict(native), "tie_word_embeddings": False, "dtype": dtype}
    src = {key: vcfg[key] for key in ("intermediate_size", "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps",
                                      "rope_theta", "rope_parameters", "max_position_embeddings") if vcfg.get(key) is not None}
    src["model_type"] = "llama"
    tlc = llama_decoder_config(src, H, vcfg["num_attention_heads"], V, info, code, layers)
    if algorithm == "eagle":
        native = {key: val for key, val in tlc.items() if key != "architectures"}
        return {"architectures": ["EagleLlamaForCausalLM"], **native, "speculators_model_type": "eagle",
                "speculators_version": SPECULATORS_VERSION, "speculators_config": speculators_block("eagle", k, info),
                "transformer_layer_config": tlc}
    if algorithm != "eagle3":
        raise InputError(f"unknown algorithm {algorithm!r}", hint="train eagle3, eagle or medusa")
    taps = list(taps) if taps else default_eagle3_taps(N)
    if sorted(set(taps)) != taps or taps[0] < 0 or taps[-1] >= N:
        raise InputError(f"tap layer ids {taps} must be distinct, ascending and in [0, {N - 1}]")
    Vd = draft_vocab or V
    if not 0 < Vd <= V:
        raise InputError(f"--draft-vocab {Vd} must be between 1 and the verifier's vocabulary ({V})")
    tlc["num_aux_hidden_states"] = len(taps)
    return {"architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3", "speculators_version": SPECULATORS_VERSION,
            "speculators_config": speculators_block("eagle3", k, info), "transformer_layer_config": tlc, "draft_vocab_size": Vd,
            "norm_before_residual": False, "target_hidden_size": None, "eagle_aux_hidden_state_layer_ids": taps,
            "norm_before_fc": False, "fc_norm": False, "norm_output": False, "tie_word_embeddings": False, "dtype": dtype}


def save_draft(out: str | Path, draft: Draft, *, train: dict[str, Any], force: bool = False) -> Path:
    """Write ``draft`` as a specfmt folder at ``out``, atomically.

    The config gets a ``specfmt`` provenance block: the source's (or, for a new draft, the
    training data as the source files) and ``train``, what the trainer did.

    Args:
        out: output folder; must not exist or be empty unless ``force``.
        draft: config and tensors; floating tensors are cast to ``config["dtype"]``.
        train: the provenance ``train`` block (filled tensors, trained tensors, steps, data).
        force: replace a non-empty ``out``.

    Returns:
        The absolute output path.

    Raises:
        OutputExistsError: ``out`` is not empty and ``force`` is False.
        RuntimeError: the tensors are not what the config implies, or are not finite
            (a specfmt bug: the trainer built them).
    """
    import torch
    from safetensors.torch import save_file

    from .checkpoint import TORCH_TO_ST, install_folder
    from .checks import inventory_problems, nonfinite_count, vocab_map_problems
    from .format import provenance_block

    from .convert import check_output, cleanup_stale

    out = Path(out).expanduser().resolve()
    check_output(out, force)
    cfg = json.loads(json.dumps(draft.config))
    dtype = getattr(torch, cfg.get("dtype") or cfg["transformer_layer_config"].get("dtype") or "float32")
    tensors = {n: (t.detach().to("cpu", dtype) if t.is_floating_point() else t.detach().cpu()).contiguous() for n, t in draft.tensors.items()}
    created = datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    src = draft.source or {"format": "specfmt-train", "layout": "new draft", "files": {}}
    prov = provenance_block(source_format=src["format"], layout=src["layout"], name_or_path=src.get("name_or_path") or "",
                            revision=src.get("revision"), files=src.get("files") or {}, renamed={}, kept=sorted(tensors), dropped={},
                            created=created)
    prov["tensors"] = ((draft.config.get("specfmt") or {}).get("tensors")) or prov["tensors"]
    prov["train"] = train
    cfg["specfmt"] = prov
    validate_config(cfg, where="trained config.json (a specfmt bug if this fails)")
    problems = inventory_problems(cfg, {n: (tuple(t.shape), TORCH_TO_ST[str(t.dtype).removeprefix("torch.")]) for n, t in tensors.items()})
    bad = [f"{k}: {', '.join(v)}" for k, v in problems.items() if v]
    bad += [f"{n} has {c} NaN/Inf values" for n, t in tensors.items() if (c := nonfinite_count(t))]
    if "d2t" in tensors:
        tlc = cfg["transformer_layer_config"]
        bad += vocab_map_problems(tensors["d2t"], tensors["t2d"], tlc["vocab_size"], cfg["draft_vocab_size"])
    if bad:
        raise RuntimeError("the trained draft is not what its config implies: " + "; ".join(bad))
    out.parent.mkdir(parents=True, exist_ok=True)
    cleanup_stale(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.specfmt-{os.getpid()}-", dir=out.parent))
    try:
        save_file(dict(sorted(tensors.items())), str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / CONFIG_FILE).write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
        install_folder(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


__all__ = ["Draft", "FILLABLE", "is_specfmt_folder", "load_draft", "new_config", "save_draft", "verifier_config"]
