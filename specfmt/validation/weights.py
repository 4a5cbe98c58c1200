"""Did vLLM load the draft's weights? Compare what vLLM's worker holds with the file.

vLLM keeps a draft tensor it did not find at its initial value without a word
(``docs/design/research-formats.md`` §1.2: the EAGLE classes' ``load_weights`` return nothing). The probe in
:mod:`specfmt.validation.vllm_run` reads back every draft parameter inside vLLM's worker; this
module maps vLLM's names back to the file's and compares.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

def vllm_weight_mismatches(run: Any, tensors: dict[str, "torch.Tensor"], rel: float = 0.02, aliases: dict[str, str] | None = None) -> list[str]:
    """Draft weights inside vLLM that are not the file's: different values, or absent from the file.

    vLLM's names (``model.layers.0.self_attn.qkv_proj``) are mapped back to the file's
    (``layers.0.self_attn.{q,k,v}_proj.weight``; ``aliases`` name the rest, e.g. EAGLE-3's
    ``draft_id_to_target_id`` is ``d2t``; default: every algorithm's :attr:`~specfmt.algorithms.base.Algorithm.vllm_aliases`);
    merged layers compare the sum over their parts. Linear layers are compared through
    :attr:`VLLMRun.draft_linear_sums` (read functionally, so repacked CPU weights count),
    other parameters through their sums. A module is reported when its sum or absolute
    sum differs by more than ``rel`` of the absolute sum (bf16 serving rounds each weight
    by up to 2**-8), or when the file has none of its tensors and vLLM did not share it
    with the verifier (:attr:`VLLMRun.draft_shares`): vLLM then keeps its initial value.
    """
    import torch

    from ..algorithms.base import REGISTRY

    names_of = aliases if aliases is not None else {k: v for a in REGISTRY.values() for k, v in a.vllm_aliases.items()}
    parts = {".qkv_proj": (".q_proj", ".k_proj", ".v_proj"), ".gate_up_proj": (".gate_proj", ".up_proj")}
    shared = {n for n, s in run.draft_shares.items() if s}

    def file_names(vname: str, suffix: str = ".weight") -> list[str]:
        """vLLM parameter or module name -> the file's tensor names (module names get ``suffix``)."""
        n = vname[len("model."):] if vname.startswith("model.") else vname
        if n in names_of:
            return [names_of[n]]
        stem, last = (n.rsplit(".", 1) + [""])[:2] if suffix == "" else (n, suffix.lstrip("."))
        for merged, split in parts.items():
            if stem.endswith(merged):
                return [stem[: -len(merged)] + p + "." + last for p in split]
        return [f"{stem}.{last}" if last else stem]

    def stats(names: list[str]) -> tuple[float, float] | None:
        if not all(n in tensors for n in names):
            return None
        ts = [tensors[n].to(torch.float64) for n in names]
        return float(sum(t.sum() for t in ts)), float(sum(t.abs().sum() for t in ts))

    def is_shared(names: list[str]) -> bool:
        return any(n.split(".")[0] in shared for n in names)

    bad = []
    seen: set[str] = set()
    for mod, (s, a) in sorted(run.draft_linear_sums.items()):
        names = file_names(mod)
        seen.update(names)
        if s is None or is_shared(names):
            continue
        want = stats(names)
        if want is None:
            if not any(n in tensors for n in names):
                bad.append(f"{'+'.join(names)}: not in the file; vLLM keeps its initial value")
            continue
        if abs(s - want[0]) > rel * max(want[1], 1e-6) or abs(a - want[1]) > rel * max(want[1], 1e-6):
            bad.append(f"{'+'.join(names)}: vLLM holds sum {s:.4g} / |sum| {a:.4g}, the file {want[0]:.4g} / {want[1]:.4g}")
    for p, (shape, s) in sorted(run.draft_parameters.items()):
        if shape == [0]:
            continue  # a repacked linear weight, compared above
        names = file_names(p, "")
        if set(names) & seen or is_shared(names):
            continue
        want = stats(names)
        if want is None:
            bad.append(f"{'+'.join(names)}: not in the file; vLLM keeps its initial value")
        elif abs(s - want[0]) > rel * max(want[1], 1e-6):
            bad.append(f"{'+'.join(names)}: vLLM holds sum {s:.4g}, the file {want[0]:.4g}")
    return bad
