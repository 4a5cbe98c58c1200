"""The specfmt format, v1: the speculators ``config.json`` and the tensors it implies.

What a checkpoint in this format is:

* ``config.json`` in the speculators format that vLLM detects by itself
  (``vllm/transformers_utils/config.py::maybe_override_with_speculators``:
  a ``speculators_config`` key), valid against ``schemas/config-v1.schema.json``.
  ``eagle3`` has **no** top-level ``model_type`` (vLLM's speculators loader reads
  ``transformer_layer_config``); vLLM 0.32's speculators loader knows no ``eagle`` or
  ``medusa``, so those also carry vLLM's native draft config at the top level
  (``model_type: llama`` / ``medusa``), which is what vLLM reads for them;
* ``model.safetensors`` (or shards with ``model.safetensors.index.json``) whose
  tensor names and shapes are exactly those :func:`expected_tensors` derives
  from the config.

Notation in docstrings: H draft hidden size, H_t verifier hidden size, V verifier
vocabulary, Vd draft vocabulary, I intermediate size, nH / nKV attention / KV
heads, d head dim, n_aux number of tap layers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from . import FORMAT_VERSION, __version__
from .errors import ConfigSchemaError, InputError, VersionError

#: The ``speculators_version`` specfmt writes: the speculators release whose
#: config layout (and vLLM's reading of it) this format follows.
SPECULATORS_VERSION = "0.9.0"

#: Oldest ``speculators_version`` recognised on read: speculators 0.1.0 dev builds,
#: also written by NVIDIA ModelOpt's exporter (``0.1.0.dev14``).
OLDEST_SPECULATORS_VERSION = "0.1.0.dev0"

#: Algorithms the v1 schema has a branch for.
ALGORITHMS = ("eagle3", "eagle", "medusa")

SCHEMA_FILE = "config-v1.schema.json"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"


# --------------------------------------------------------------------------- schema


@lru_cache(maxsize=1)
def load_schema() -> dict[str, Any]:
    """The v1 JSON Schema (draft 2020-12), read from the installed ``specfmt.schemas``."""
    text = resources.files("specfmt.schemas").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")
    return json.loads(text)


def _json_path(parts) -> str:
    path = "$"
    for p in parts:
        path += f"[{p}]" if isinstance(p, int) else f".{p}"
    return path


def schema_violations(config: Any) -> list[tuple[str, str]]:
    """Every violation of the v1 schema and of the rules a schema cannot state.

    Args:
        config: a parsed ``config.json``.

    Returns:
        ``[(json_path, message), ...]`` sorted by path; empty when the config is valid.
        Paths look like ``$.speculators_config.proposal_methods[0].speculative_tokens``.
    """
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(load_schema(), format_checker=Draft202012Validator.FORMAT_CHECKER)
    out = []
    for err in validator.iter_errors(config):
        msg = err.message
        if err.validator == "not" and isinstance(err.validator_value, dict):
            msg = err.validator_value.get("description", msg)
        out.append((_json_path(err.absolute_path), msg))
    if not out and isinstance(config, dict):
        out.extend(_semantic_violations(config))
    return sorted(set(out))


def _semantic_violations(cfg: dict[str, Any]) -> list[tuple[str, str]]:
    """Cross-field rules of the format (only run once the schema holds)."""
    out = []
    algo = cfg["speculators_model_type"]
    sc = cfg["speculators_config"]
    if sc["algorithm"] != algo:
        out.append(("$.speculators_config.algorithm", f"{sc['algorithm']!r} differs from speculators_model_type {algo!r}"))
    kinds = [m["proposal_type"] for m in sc["proposal_methods"]]
    if sc["default_proposal_method"] not in kinds:
        out.append(("$.speculators_config.default_proposal_method", f"{sc['default_proposal_method']!r} is not one of the proposal_methods {kinds}"))
    tlc = cfg["transformer_layer_config"]
    if algo == "eagle3":
        if cfg["draft_vocab_size"] > tlc["vocab_size"]:
            out.append(("$.draft_vocab_size", f"{cfg['draft_vocab_size']} is larger than the verifier vocabulary transformer_layer_config.vocab_size={tlc['vocab_size']}"))
        ids = cfg["eagle_aux_hidden_state_layer_ids"]
        if list(ids) != sorted(ids):
            out.append(("$.eagle_aux_hidden_state_layer_ids", f"{ids} is not ascending; vLLM concatenates the taps in ascending layer order"))
        n_aux = tlc.get("num_aux_hidden_states")
        if n_aux is not None and n_aux != len(ids):
            out.append(("$.transformer_layer_config.num_aux_hidden_states", f"{n_aux} differs from the {len(ids)} tap layers"))
        if n_aux is None and len(ids) != 3:
            out.append(("$.transformer_layer_config.num_aux_hidden_states", f"missing with {len(ids)} tap layers; vLLM then sizes fc for 3"))
        if cfg.get("norm_before_fc") and cfg.get("fc_norm"):
            out.append(("$.fc_norm", "fc_norm and norm_before_fc cannot both be true"))
    if algo in ("eagle", "medusa"):
        # vLLM reads the top-level native config; transformer_layer_config must say the same
        for key, val in tlc.items():
            if key in cfg and key not in ("architectures",) and cfg[key] != val:
                out.append((f"$.transformer_layer_config.{key}", f"{val!r} differs from the top-level {key}={cfg[key]!r} that vLLM reads"))
    if algo == "medusa":
        k = sc["proposal_methods"][0]["speculative_tokens"]
        if k != cfg["num_heads"]:
            out.append(("$.speculators_config.proposal_methods[0].speculative_tokens", f"{k} differs from num_heads={cfg['num_heads']}; vLLM builds one head per speculative token"))
        if cfg["truncated_vocab_size"] != cfg["vocab_size"]:
            out.append(("$.truncated_vocab_size", f"{cfg['truncated_vocab_size']} differs from vocab_size={cfg['vocab_size']}; specfmt writes no token_map"))
        for key in cfg:
            # MedusaConfig.from_pretrained renames any key holding "num" and "heads"/"layers" (vLLM 0.32)
            if "num" in key and ("heads" in key or "layers" in key) and key not in ("num_heads", "num_hidden_layers"):
                out.append((f"$.{key}", "vLLM's MedusaConfig renames this key onto num_heads/num_hidden_layers; remove it"))
    return out


def validate_config(config: Any, where: str) -> None:
    """Raise :class:`ConfigSchemaError` listing every violation (with its JSON path).

    Args:
        config: a parsed ``config.json``.
        where: the file it came from, for the message.
    """
    violations = schema_violations(config)
    if violations:
        first = "; ".join(f"{p}: {m}" for p, m in violations[:3])
        more = f" (and {len(violations) - 3} more)" if len(violations) > 3 else ""
        raise ConfigSchemaError(
            f"config does not match the specfmt v1 schema: {first}{more}",
            violations,
            where=where,
            hint="run `specfmt validate` on the folder for the full list",
        )


# --------------------------------------------------------------------------- versions


@dataclass(frozen=True)
class VersionStatus:
    """How a ``speculators_version`` relates to the one specfmt writes.

    Attributes:
        status: ``"current"``, ``"older"`` (recognised, readable; an upgrade will
            rewrite it) or ``"newer"`` (unknown to this specfmt).
        message: one line for the user.
    """

    status: str
    message: str


def check_speculators_version(version: Any) -> VersionStatus:
    """Classify a config's ``speculators_version``.

    Raises:
        VersionError: the value is not a string or not a PEP 440 version.
    """
    from packaging.version import InvalidVersion, Version

    if not isinstance(version, str):
        raise VersionError(f"speculators_version must be a string, got {version!r}", where="$.speculators_version")
    try:
        v = Version(version)
    except InvalidVersion:
        raise VersionError(f"speculators_version {version!r} is not a valid version", where="$.speculators_version") from None
    cur = Version(SPECULATORS_VERSION)
    if v.release[:2] == cur.release[:2] and v <= Version(f"{cur.major}.{cur.minor}.999"):
        return VersionStatus("current", f"speculators format {version} (current: {SPECULATORS_VERSION})")
    if Version(OLDEST_SPECULATORS_VERSION) <= v < cur:
        return VersionStatus(
            "older",
            f"older speculators format {version} (current {SPECULATORS_VERSION}); readable, "
            f"re-convert from the research checkpoint to get the current layout",
        )
    return VersionStatus(
        "newer",
        f"speculators format {version} is newer than this specfmt knows ({SPECULATORS_VERSION}); upgrade specfmt",
    )


# --------------------------------------------------------------------------- reading configs


def read_json(path: Path) -> dict[str, Any]:
    """Parse a JSON object file.

    Raises:
        InputError: missing, unreadable, not JSON, or not a JSON object; a symlink out of its folder
            (:func:`specfmt.checkpoint.check_inside`).
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path.name} not found", where=str(path.parent), hint="point at a folder that holds the checkpoint's config.json")
    if path.is_symlink():
        from .checkpoint import check_inside

        check_inside(path.parent, path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise InputError("not a UTF-8 text file", where=str(path)) from None
    except json.JSONDecodeError as e:
        raise InputError(f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}", where=str(path)) from None
    if not isinstance(data, dict):
        raise InputError(f"expected a JSON object, got {type(data).__name__}", where=str(path))
    return data


def jsonl_objects(path: str | Path, text: str | None = None):
    """Yield ``(where, obj)`` for every non-blank line of a jsonl file, ``where`` = ``path:line``.

    Raises:
        InputError: a line is not JSON (named ``path:line``).
    """
    text = Path(path).read_text(encoding="utf-8") if text is None else text
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"line is not JSON ({e.msg})", where=where) from None


@dataclass(frozen=True)
class VerifierInfo:
    """What a draft needs to know of its verifier (from the verifier's config.json).

    Multimodal configs are unwrapped through ``text_config``.

    Attributes:
        name_or_path: Hub id or absolute path, as written into the draft config.
        architectures: the verifier's ``architectures``.
        hidden_size: H_t.
        vocab_size: V.
        num_hidden_layers: N, the number of decoder layers (tap ids must be < N).
        max_position_embeddings: the verifier's context length, or None.
        tie_word_embeddings: the verifier's lm_head is its input embedding.
    """

    name_or_path: str
    architectures: tuple[str, ...]
    hidden_size: int
    vocab_size: int
    num_hidden_layers: int
    max_position_embeddings: int | None
    tie_word_embeddings: bool = False

    @classmethod
    def from_config(cls, cfg: dict[str, Any], name_or_path: str, where: str) -> "VerifierInfo":
        """Read the fields from a verifier config.json.

        Raises:
            InputError: a required field is missing or not a positive integer.
        """
        text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}

        def field(key: str, required: bool = True):
            val = text.get(key, cfg.get(key))
            if val is None and not required:
                return None
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                raise InputError(
                    f"verifier config has no valid {key} (got {val!r})",
                    where=where,
                    hint="--verifier must name the verifier model (a folder or Hub id with its config.json)",
                )
            return val

        archs = cfg.get("architectures") or text.get("architectures") or []
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs) or not archs:
            raise InputError("verifier config has no architectures list", where=where)
        return cls(
            name_or_path=name_or_path,
            architectures=tuple(archs),
            hidden_size=field("hidden_size"),
            vocab_size=field("vocab_size"),
            num_hidden_layers=field("num_hidden_layers"),
            max_position_embeddings=field("max_position_embeddings", required=False),
            tie_word_embeddings=bool(text.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
        )


def default_eagle3_taps(num_layers: int) -> list[int]:
    """The EAGLE-3 reference tap layers ``(2, N//2, N-3)`` for a verifier with N layers.

    Source: SafeAILab/EAGLE ``eagle/model/modeling_llama_kv.py`` (``idx==2``,
    ``idx==len(self.layers)//2``, ``idx==len(self.layers)-3``); also vLLM's Llama
    ``get_eagle3_aux_hidden_state_layers``.

    Raises:
        InputError: N < 6, where the three taps would not be distinct.
    """
    taps = sorted({2, num_layers // 2, num_layers - 3})
    if num_layers < 6 or len(taps) != 3:
        raise InputError(
            f"the verifier has {num_layers} layers; the EAGLE-3 default taps (2, N//2, N-3) need N >= 6",
            hint="give the tap layers with --aux-layers",
        )
    return taps


# --------------------------------------------------------------------------- tensors


@dataclass(frozen=True)
class TensorSpec:
    """A tensor the config implies.

    Attributes:
        shape: exact shape.
        kind: ``"float"`` (any floating dtype, one dtype for the whole checkpoint),
            ``"int64"`` or ``"bool"``.
        required: False for tensors that may be absent (e.g. ``embed_tokens.weight``
            when vLLM can share the verifier's).
        why: where the rule comes from, shown when the tensor is missing.
    """

    shape: tuple[int, ...]
    kind: str = "float"
    required: bool = True
    why: str = ""


def _decoder_layer_specs(prefix: str, tlc: dict[str, Any], in_width: int, *, input_norm: bool = True, hidden_norm: bool = False) -> dict[str, TensorSpec]:
    H = tlc["hidden_size"]
    I = tlc["intermediate_size"]
    nH = tlc["num_attention_heads"]
    nKV = tlc["num_key_value_heads"]
    d = tlc.get("head_dim") or H // nH
    specs = {
        f"{prefix}.self_attn.q_proj.weight": TensorSpec((nH * d, in_width)),
        f"{prefix}.self_attn.k_proj.weight": TensorSpec((nKV * d, in_width)),
        f"{prefix}.self_attn.v_proj.weight": TensorSpec((nKV * d, in_width)),
        f"{prefix}.self_attn.o_proj.weight": TensorSpec((H, nH * d)),
        f"{prefix}.mlp.gate_proj.weight": TensorSpec((I, H)),
        f"{prefix}.mlp.up_proj.weight": TensorSpec((I, H)),
        f"{prefix}.mlp.down_proj.weight": TensorSpec((H, I)),
        f"{prefix}.post_attention_layernorm.weight": TensorSpec((H,)),
    }
    if input_norm:
        specs[f"{prefix}.input_layernorm.weight"] = TensorSpec((H,))
    if hidden_norm:
        specs[f"{prefix}.hidden_norm.weight"] = TensorSpec((H,))
    if tlc.get("attention_bias"):
        for p, n in (("q", nH), ("k", nKV), ("v", nKV)):
            specs[f"{prefix}.self_attn.{p}_proj.bias"] = TensorSpec((n * d,))
        specs[f"{prefix}.self_attn.o_proj.bias"] = TensorSpec((H,))
    if tlc.get("mlp_bias"):
        specs[f"{prefix}.mlp.gate_proj.bias"] = TensorSpec((I,))
        specs[f"{prefix}.mlp.up_proj.bias"] = TensorSpec((I,))
        specs[f"{prefix}.mlp.down_proj.bias"] = TensorSpec((H,))
    if tlc.get("model_type") == "qwen3":
        specs[f"{prefix}.self_attn.q_norm.weight"] = TensorSpec((d,))
        specs[f"{prefix}.self_attn.k_norm.weight"] = TensorSpec((d,))
    return specs


def expected_tensors(cfg: dict[str, Any]) -> dict[str, TensorSpec]:
    """The tensors (names, shapes, kinds) a schema-valid config implies.

    Dispatches on ``speculators_model_type``; see :func:`_eagle3_tensors`,
    :func:`_eagle_tensors` and :func:`_medusa_tensors` for the tables.

    Raises:
        InputError: an algorithm without a known tensor layout.
    """
    algo = cfg["speculators_model_type"]
    table = {"eagle3": _eagle3_tensors, "eagle": _eagle_tensors, "medusa": _medusa_tensors}
    if algo not in table:
        raise InputError(f"no tensor layout known for speculators_model_type {algo!r}")
    return table[algo](cfg)


def _eagle3_tensors(cfg: dict[str, Any]) -> dict[str, TensorSpec]:
    """EAGLE-3 (tensor table: ``research-formats.md`` §4.3; vLLM ``llama_eagle3.py``):

    ============================== ====================== =====================================
    name                           shape                  when
    ============================== ====================== =====================================
    ``fc.weight``                  [H, n_aux·H_t]         always
    ``layers.0.self_attn.q_proj``  [nH·d, 2H]             k/v: [nKV·d, 2H]; o_proj [H, nH·d]
    ``layers.0.hidden_norm``       [H]                    plus input/post-attention norms, MLP
    ``layers.{i≥1}.*``             standard Llama layer   ``num_hidden_layers`` > 1
    ``norm.weight``                [H]                    always
    ``lm_head.weight``             [Vd, H]                always
    ``d2t`` / ``t2d``              [Vd] int64 / [V] bool  when Vd < V (never when Vd = V)
    ``embed_tokens.weight``        [V, H]                 required when H_t ≠ H, else optional
    ``input_norm.weight``          [n_aux·H_t]            ``norm_before_fc``
    ``fc_norm.{k}.weight``         [H_t]                  ``fc_norm``
    ============================== ====================== =====================================
    """
    tlc = cfg["transformer_layer_config"]
    H = tlc["hidden_size"]
    V = tlc["vocab_size"]
    Vd = cfg["draft_vocab_size"]
    Ht = cfg.get("target_hidden_size") or H
    n_aux = len(cfg["eagle_aux_hidden_state_layer_ids"])
    specs: dict[str, TensorSpec] = {"fc.weight": TensorSpec((H, n_aux * Ht))}
    for i in range(tlc["num_hidden_layers"]):
        specs.update(_decoder_layer_specs(f"layers.{i}", tlc, 2 * H if i == 0 else H, hidden_norm=i == 0))
    specs["norm.weight"] = TensorSpec((H,))
    specs["lm_head.weight"] = TensorSpec((Vd, H))
    if Vd < V:  # a full-vocabulary draft has no map: vLLM rejects d2t when Vd = V
        why_vocab = "Vd < V: without d2t vLLM reads draft id i as target id i and acceptance collapses"
        specs["d2t"] = TensorSpec((Vd,), "int64", why=why_vocab)
        specs["t2d"] = TensorSpec((V,), "bool", why=why_vocab)
    specs["embed_tokens.weight"] = TensorSpec(
        (V, H), required=Ht != H, why="H_t != H: the verifier's embedding has the wrong width for the draft"
    )
    if cfg.get("norm_before_fc"):
        specs["input_norm.weight"] = TensorSpec((n_aux * Ht,))
    if cfg.get("fc_norm"):
        for k in range(n_aux):
            specs[f"fc_norm.{k}.weight"] = TensorSpec((Ht,))
    return specs


def _eagle_tensors(cfg: dict[str, Any]) -> dict[str, TensorSpec]:
    """EAGLE-1/2 and HASS (``research-formats.md`` §2.3/§2.5; vLLM ``llama_eagle.py``):

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
    H = cfg["hidden_size"]
    specs: dict[str, TensorSpec] = {"fc.weight": TensorSpec((H, 2 * H))}
    for i in range(cfg["num_hidden_layers"]):
        specs.update(_decoder_layer_specs(f"layers.{i}", cfg, H, input_norm=i > 0))
    specs["embed_tokens.weight"] = TensorSpec((cfg["vocab_size"], H), required=False)
    return specs


def _medusa_tensors(cfg: dict[str, Any]) -> dict[str, TensorSpec]:
    """Medusa (``research-formats.md`` §5.4; vLLM ``medusa.py``), K heads of L blocks:

    ================================ ========= ==========================================
    name                             shape     when
    ================================ ========= ==========================================
    ``blocks.{i}.layers.{j}.weight`` [H, H]    i < K, j < L
    ``blocks.{i}.layers.{j}.bias``   [H]       ``medusa_fc_bias``
    ``lm_heads.{i}.weight``          [V, H]    i < K, unless ``original_lm_head``
    ``lm_head.weight``               [V, H]    ``original_lm_head`` (one head shared by all)
    ================================ ========= ==========================================
    """
    H, V, K, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_heads"], cfg["num_hidden_layers"]
    specs: dict[str, TensorSpec] = {}
    for i in range(K):
        for j in range(L):
            specs[f"blocks.{i}.layers.{j}.weight"] = TensorSpec((H, H))
            if cfg["medusa_fc_bias"]:
                specs[f"blocks.{i}.layers.{j}.bias"] = TensorSpec((H,))
        if not cfg["original_lm_head"]:
            specs[f"lm_heads.{i}.weight"] = TensorSpec((V, H))
    if cfg["original_lm_head"]:
        specs["lm_head.weight"] = TensorSpec((V, H), why="original_lm_head: the one head all Medusa heads share")
    return specs


def provenance_block(
    *,
    source_format: str,
    layout: str,
    name_or_path: str,
    revision: str | None,
    files: dict[str, str],
    renamed: dict[str, str],
    kept: list[str],
    dropped: dict[str, str],
    created: str,
    folded: dict[str, str] | None = None,
    derived: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The ``specfmt`` provenance block (ignored by vLLM).

    Args:
        files: sha256 (hex) of every source file read, by file name.
        renamed / kept / dropped / folded: what happened to every source tensor
            (dropped and folded map a tensor to the reason).
        derived: output tensors computed rather than copied, with how.
        created: ISO 8601 UTC time.
    """
    return {
        "format_version": FORMAT_VERSION,
        "specfmt_version": __version__,
        "created": created,
        "source": {
            "format": source_format,
            "layout": layout,
            "name_or_path": name_or_path,
            "revision": revision,
            "files": dict(sorted(files.items())),
        },
        "tensors": {"renamed": renamed, "kept": kept, "dropped": dropped, "folded": dict(folded or {}), "derived": dict(derived or {})},
    }
