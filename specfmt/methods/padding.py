"""The padding fix: a copy of a draft LM whose embedding and output head have the verifier's row count.

vLLM 0.30-0.33 serve a ``draft_model`` pair only when the two ``vocab_size`` are equal
(``SpeculativeConfig.verify_equal_vocab_size_if_draft_model``), also when the two share one tokenizer and
differ only by padding rows past its length: Qwen2-1.5B has 151,936 rows and Qwen2-72B 152,064 (vLLM issues
#5203, #7252, #10913; PR #42775, not in 0.32, proposes ``allow_draft_model_vocab_padding``). Rows past the
tokenizer's length are no token: the verifier never feeds one to the draft, and the draft must never propose one.
:func:`pad_vocab` writes the draft again with the verifier's row count:

* a draft with fewer rows gets rows appended: zeros in the input embedding (no token reads them);
* a draft with more rows loses the rows past the verifier's count (all past the tokenizer's length: the
  pair check ``vocab_size`` calls the difference padding-only only then);
* **every row of the output head past the tokenizer's length becomes a copy of one real token's row**
  (:func:`padding_source`: the pad token's, else eos's, else id 0). A padded id's logit is then exactly that
  token's, never more than the largest real logit, and greedy argmax (torch's and vLLM's ``argmax``: the first
  maximal index) takes the real token, whose id is lower, on a tie: **no padded id can be proposed**
  (``tests/test_pairs.py`` checks it on every position of the prompts);
* every other tensor and file is copied unchanged (tensors compared after writing), config.json gets the new
  ``vocab_size`` and a ``specfmt.pad_vocab`` block recording what was done, from what and for which verifier.

The folder is written through the project's output mechanism: :func:`~specfmt.checkpoint.output.check_output`
with every input, then :func:`~specfmt.checkpoint.output.atomic_folder`.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..checkpoint.files import CONFIG_FILE, weight_file_digests
from ..checkpoint.output import Input, atomic_folder, check_output
from ..errors import InputError
from ..format.provenance import utc_now

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .draft_lm import DraftLM

#: the output head and the input embedding of a causal LM, by the names transformers saves them under
HEAD_NAMES = ("lm_head.weight",)
EMBED_SUFFIX = "embed_tokens.weight"


@dataclass
class PadResult:
    """What :func:`pad_vocab` wrote.

    Attributes:
        out: the folder written.
        rows: ``(draft rows before, verifier rows)``.
        tokenizer_length: the tokenizer's length (rows at and past it are padding).
        changed: the tensors rewritten (the embedding and the output head).
        copied: the tensors written unchanged.
        source_row: the real token whose output row every padding row copies.
        record: the ``specfmt.pad_vocab`` block written into config.json.
    """

    out: Path
    rows: tuple[int, int]
    tokenizer_length: int
    changed: list[str]
    copied: list[str]
    source_row: int
    record: dict[str, Any] = field(default_factory=dict)


def padding_source(tokenizer: Any) -> int:
    """The real token whose output-head row every padding row copies: the pad token, else eos, else id 0."""
    for attr in ("pad_token_id", "eos_token_id"):
        i = getattr(tokenizer, attr, None)
        if isinstance(i, int) and i >= 0:
            return i
    return 0


def resized(t: "torch.Tensor", rows: int, tokens: int, *, head: bool, source: int) -> "torch.Tensor":
    """``t`` [R, H] with ``rows`` rows: rows past ``rows`` dropped, new rows zeros; for the output head (``head``)
    every row from ``tokens`` on is row ``source``'s copy."""
    import torch

    out = t[:rows].clone() if t.shape[0] >= rows else torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])])
    if head and rows > tokens:
        out[tokens:] = out[source]
    return out


def pad_vocab(draft: "str | DraftLM", verifier: str, out: str | Path, *, force: bool = False) -> PadResult:
    """Write ``draft`` again with the verifier's vocabulary rows (see the module docstring).

    Args:
        draft: the draft LM (a folder or Hub id, or the method already resolved).
        verifier: the verifier (a folder or Hub id).
        out: the output folder (written atomically; never an input, never inside or around one).
        force: replace a non-empty ``out`` (an earlier output, never an input).

    Returns:
        A :class:`PadResult`.

    Raises:
        InputError: ``draft`` is no draft LM; the pair is not one tokenizer with a padding-only difference (equal
            rows: nothing to do; two tokenizers, or rows fewer than the tokenizer's tokens: padding cannot fix it);
            ``out`` collides with an input or exists (:class:`~specfmt.checkpoint.output.OutputOverlapError`,
            :class:`~specfmt.errors.OutputExistsError`).
    """
    from ..sources.verifier import Verifier
    from . import resolve
    from .draft_lm import DraftLM

    method = resolve(draft) if isinstance(draft, str) else draft
    if not isinstance(method, DraftLM):
        from ..detect import detect

        what = detect(method.folder).what if method.folder is not None else ""
        raise InputError(f"pad-vocab rewrites a draft model (a causal LM folder); this folder is {what or 'not one'}", where=method.ref)
    ver = Verifier.load(verifier)
    out = Path(out).expanduser()
    check_output(out, force, [*Input.of("DRAFT", method.named, method.resolved), *Input.of("--verifier", verifier, ver.resolved)])
    pair = method.pair(ver)
    _check_padding_only(method, ver, pair)
    return _write(method, ver, pair.tokens.verifier_len, out)


def _check_padding_only(method: "DraftLM", ver: Any, pair: Any) -> None:
    """Refuse a pair padding does not fix (one line each)."""
    if pair.relation == "same":
        raise InputError(f"nothing to pad: the draft and the verifier both have {pair.verifier_rows} rows", where=method.ref)
    if pair.heterogeneous:
        raise InputError("the draft has a tokenizer of its own: padding cannot make its ids the verifier's", where=method.ref,
                         hint="serve the pair with use_heterogeneous_vocab (`specfmt serve-command DRAFT --verifier V` prints it)")
    if pair.relation == "truncated":
        raise InputError(f"the draft has {pair.draft_rows} rows for a tokenizer of {pair.tokens.verifier_len} tokens: rows of real tokens are missing, "
                         "which padding cannot add back", where=method.ref)


def _write(method: "DraftLM", ver: Any, tokens: int, out: Path) -> PadResult:
    import torch
    from safetensors.torch import load_file, save_file

    folder = method.folder
    assert folder is not None
    rows = ver.info.vocab_size
    before = method.vocab_size
    source = padding_source(method.tokenizer())
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    tied = bool(method.config.get("tie_word_embeddings"))
    changed = sorted(n for n in tensors if (n in HEAD_NAMES or n.endswith(EMBED_SUFFIX)) and tensors[n].dim() == 2 and tensors[n].shape[0] == before)
    if not any(n in HEAD_NAMES for n in changed) and not tied:
        raise InputError(f"the draft's weights hold no output head of {before} rows (lm_head.weight)", where=str(folder))
    new = {n: resized(t, rows, tokens, head=n in HEAD_NAMES or tied, source=source) if n in changed else t for n, t in tensors.items()}
    cfg = dict(method.config)
    cfg["vocab_size"] = rows
    record = {"source": method.ref, "source_files": weight_file_digests(folder), "verifier": ver.name_or_path, "rows": [before, rows],
              "tokenizer_length": tokens, "changed": changed,
              "padding_rows": f"output-head rows {tokens}..{rows - 1} copy row {source} (the pad/eos token): a padded id's logit is never above "
                              "that token's, and argmax takes the lower id on a tie",
              **({"added_embedding_rows": "zeros"} if rows > before else {"dropped_rows": f"{rows}..{before - 1}"})}
    cfg["specfmt"] = {**(cfg.get("specfmt") if isinstance(cfg.get("specfmt"), dict) else {}), "specfmt_version": __version__, "created": utc_now(),
                      "pad_vocab": record}
    with atomic_folder(out) as tmp:
        for p in sorted(folder.iterdir()):
            if p.is_file() and p.suffix != ".safetensors" and p.name not in (CONFIG_FILE, "model.safetensors.index.json", "README.md", "validation.json"):
                shutil.copyfile(p, tmp / p.name)
        (tmp / CONFIG_FILE).write_text(json.dumps(cfg, indent=2) + "\n")
        save_file({n: t.contiguous() for n, t in new.items()}, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        _check_written(tmp, tensors, changed)
    return PadResult(out, (before, rows), tokens, changed, sorted(set(tensors) - set(changed)), source, record)


def _check_written(tmp: Path, before: dict[str, "torch.Tensor"], changed: list[str]) -> None:
    """Every tensor but the changed ones is the draft's, element by element, in its dtype (a failure is our bug)."""
    import torch
    from safetensors.torch import load_file

    written = load_file(str(tmp / "model.safetensors"))
    assert set(written) == set(before), sorted(set(written) ^ set(before))
    for n, t in before.items():
        if n not in changed:
            assert written[n].dtype == t.dtype and torch.equal(written[n], t), n


__all__ = ["PadResult", "pad_vocab", "padding_source", "resized"]
