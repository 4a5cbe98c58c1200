"""The proposal-method interface (issue 36): one registry reads what the user named, shared code never branches on
a method's name, and the chain loop counts a step without a proposal as a verifier forward pass."""

from __future__ import annotations

import ast

import pytest

from conftest import REPO, WORLD
from test_architecture import _branches_on_algorithm, modules

#: the names of the proposal methods that are not speculators algorithms (``speculators`` is also a format name, which detect.py compares)
METHOD_NAMES = {"draft_model", "ngram", "suffix"}


def test_no_module_outside_the_methods_branches_on_a_method_name():
    offenders = {}
    for name, path in modules().items():
        if name.startswith("specfmt.methods"):
            continue
        found = _branches_on_algorithm(ast.parse(path.read_text()), METHOD_NAMES)
        if found:
            offenders[str(path.relative_to(REPO))] = found
    assert offenders == {}
    assert _branches_on_algorithm(ast.parse('if m.name == "ngram": pass\n'), METHOD_NAMES) == [1]


def test_the_registry_reads_what_the_user_named():
    from specfmt.methods import REGISTRY, resolve
    from specfmt.methods.draft_lm import DraftLM
    from specfmt.methods.speculators import SpeculatorsMethod

    assert isinstance(resolve(str(WORLD / "verifier")), DraftLM)  # a causal LM: a draft model
    research = resolve(str(WORLD / "eagle3-safeailab"))  # not a speculators draft: the fallback, whose checks say what it is
    assert isinstance(research, SpeculatorsMethod) and research.algorithm is None
    rep = research.static_checks(None)
    assert rep.check("schema").status == "fail" and "specfmt convert --from eagle3" in rep.check("schema").summary
    assert [c.fallback for c in REGISTRY].count(True) == 1


def test_a_kind_registered_later_is_found_by_its_builtin_name():
    """What issue 37 does for n-gram and suffix decoding: register a kind with a built-in name; nothing else changes."""
    from specfmt import methods
    from specfmt.methods.base import ProposalMethod

    class Lookup(ProposalMethod):
        name, builtin_names = "lookup-test", ("lookup-test",)

        @classmethod
        def builtin(cls, name):
            return cls(name)

    saved = list(methods.REGISTRY)
    try:
        methods.register(Lookup)
        found = methods.resolve("lookup-test")
        assert isinstance(found, Lookup) and found.ref == "lookup-test" and found.folder is None and "lookup-test" in methods.builtin_names()
        with pytest.raises(ValueError, match="taken"):
            methods.register(Lookup)
    finally:
        methods.REGISTRY[:] = saved


def test_a_step_without_a_proposal_is_a_verifier_pass():
    """A method that proposes nothing at some steps (n-gram without a match): those steps are verifier forward passes
    that yield one token; vLLM's num_drafts counts only the drafted ones."""
    import torch
    from transformers import AutoModelForCausalLM

    from specfmt.validation.acceptance import greedy_path, run_chain

    model = AutoModelForCausalLM.from_pretrained(str(WORLD / "verifier")).eval()
    prompt = [0, 5, 9, 300, 41]
    path, _ = greedy_path(model, prompt, 20)
    calls = []

    def every_other(tokens, states, k):  # the path itself on odd calls, nothing on even ones
        calls.append(len(tokens))
        if len(calls) % 2:
            return []
        g = len(tokens) - len(prompt)
        return path[g: g + 2]  # fewer than k: 2 of 3

    with torch.no_grad():
        res = run_chain(model, [prompt], every_other, 3, 12)
    assert res.token_ids == [path[:12]]
    drafted = len(calls) // 2
    assert res.steps == len(calls) and res.num_drafts == drafted and res.num_draft_tokens == 2 * drafted
    assert res.num_accepted_tokens == 2 * drafted and res.accepted_per_position == [drafted, drafted, 0]
    assert res.mean_acceptance_length == 3.0 and res.tokens_per_step == pytest.approx(1 + 2 * drafted / len(calls))
    # 1 token from the prefill, then alternately 1 (no proposal) and 3 (2 accepted + the verifier's): 2, 5, 6, 9, 10, 13 >= 12
    assert (res.steps, res.num_drafts, res.num_accepted_tokens) == (6, 3, 6)

    with pytest.raises(ValueError, match="at most 3"):
        run_chain(model, [prompt], lambda t, s, k: [1, 2, 3, 4], 3, 4)
