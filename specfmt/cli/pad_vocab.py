"""``specfmt pad-vocab``: the padding fix of a draft-model pair (:mod:`specfmt.methods.padding`)."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import ctrl_c_ends_in_one_line, json_option, out, report, reports_errors
from .output import writes


@ctrl_c_ends_in_one_line
@reports_errors
@writes("output", inputs=("draft", "verifier"), force="force")
def pad_vocab(
    draft: str = typer.Argument(..., help="The draft model: a causal LM folder (or Hub id) with the verifier's tokenizer."),
    verifier: str = typer.Option(..., "--verifier", help="The verifier whose vocabulary size the draft takes: a folder or a Hub id."),
    output: Path = typer.Option(..., "-o", "--output", help="Output folder (created atomically)."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty output folder; never an input (OUT may not be, contain or lie inside one)."),
    as_json: bool = json_option(),
) -> None:
    """Write a copy of a draft model whose embedding and output head have the verifier's vocabulary rows, so that vLLM serves the pair.

    vLLM 0.30-0.33 refuse a draft_model pair whose vocab_size differ, also when the difference is padding rows past
    one shared tokenizer (vLLM issues #5203, #7252, #10913). Rows are added (zeros in the embedding) or padding rows
    dropped; every output-head row past the tokenizer copies a real token's row, so no padded id is ever proposed.
    Every other tensor and file is copied unchanged; config.json records what was done (specfmt.pad_vocab).
    """
    from ..methods.padding import pad_vocab as run

    res = run(draft, verifier, output, force=force)
    before, after = res.rows
    report(output=str(res.out), changed=list(res.changed), rows_before=before, rows_after=after, tokenizer_length=res.tokenizer_length,
           copied=len(res.copied), serve=f"specfmt serve-command {res.out} --verifier {verifier}")
    how = f"{after - before} rows added" if after > before else f"{before - after} padding rows dropped"
    out.print(f"wrote {res.out}: {', '.join(res.changed)} {before} -> {after} rows ({how}; the tokenizer has {res.tokenizer_length} tokens), "
              f"{len(res.copied)} other tensors unchanged", markup=False, highlight=False, soft_wrap=True)
    out.print(f"serve it: specfmt serve-command {res.out} --verifier {verifier}", markup=False, highlight=False, soft_wrap=True)
