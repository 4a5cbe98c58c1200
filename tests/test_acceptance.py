"""The reference greedy chain loop (`specfmt.acceptance`): exactness and the acceptance figures."""

from __future__ import annotations

import pytest
import torch

from specfmt.validation.acceptance import run_chain, verifier_states


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).eval()


def greedy(model, prompt, n):
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(verifier_states(model, seq).logits[-1].argmax()))
    return seq[len(prompt):]


PROMPTS = [[1, 5, 9, 3], [7, 7, 2]]


def test_oracle_draft_is_always_accepted(model):
    def oracle(tokens, states, k):
        assert states.logits.shape[0] == len(tokens) - 1 and len(states.hidden) == 3
        return greedy(model, tokens, k)

    res = run_chain(model, PROMPTS, oracle, k=3, max_tokens=13)
    assert res.token_ids == [greedy(model, p, 13) for p in PROMPTS]
    assert res.accepted_per_position == [res.num_drafts] * 3
    assert res.mean_acceptance_length == 4.0 and res.num_draft_tokens == 3 * res.num_drafts
    assert res.num_drafts == 2 * 3  # 1 + 3 steps of 4 tokens = 13 per prompt


def test_wrong_draft_is_never_accepted_and_output_is_unchanged(model):
    def wrong(tokens, states, k):
        return [(t + 1) % 97 for t in greedy(model, tokens, k)]

    res = run_chain(model, PROMPTS, wrong, k=2, max_tokens=6)
    assert res.token_ids == [greedy(model, p, 6) for p in PROMPTS]
    assert res.num_accepted_tokens == 0 and res.mean_acceptance_length == 1.0
    assert res.num_drafts == 2 * 5


def test_partial_acceptance_is_counted_per_position(model):
    def first_only(tokens, states, k):
        g = greedy(model, tokens, k)
        return [g[0]] + [(t + 1) % 97 for t in g[1:]]

    res = run_chain(model, PROMPTS, first_only, k=3, max_tokens=9)
    assert res.accepted_per_position == [res.num_drafts, 0, 0]
    assert res.acceptance_rate_per_position == [1.0, 0.0, 0.0]
    assert res.mean_acceptance_length == 2.0
    assert res.token_ids == [greedy(model, p, 9) for p in PROMPTS]


def test_medusa_identity_heads_propose_the_newest_token(model):
    """Zero blocks and the verifier's head: every head proposes argmax(lm_head(h)) = the token just produced."""
    from specfmt.algorithms.medusa import medusa_proposer

    H = 32
    head = model.lm_head.weight.detach()
    tensors = {f"blocks.{i}.layers.0.{p}": torch.zeros(*((H, H) if p == "weight" else (H,))) for i in range(3) for p in ("weight", "bias")}
    tensors |= {f"lm_heads.{i}.weight": head for i in range(3)}
    propose = medusa_proposer(tensors, {"num_hidden_layers": 1, "original_lm_head": False})
    seq = [1, 5, 9]
    states = verifier_states(model, seq)
    x = int(states.logits[-1].argmax())
    assert propose(seq + [x], states, 3) == [x, x, x]
    res = run_chain(model, PROMPTS, propose, k=3, max_tokens=8)
    assert res.token_ids == [greedy(model, p, 8) for p in PROMPTS]


def test_eagle1_fold_gives_the_same_proposals_as_the_source(model, tmp_path):
    """The converted (folded) EAGLE-1 draft drafts exactly what the research checkpoint drafts."""
    import json

    from builders import eagle1_tensors, write_verifier
    from safetensors.torch import load_file

    from specfmt.convert import convert
    from specfmt.algorithms.eagle import eagle1_proposer

    sd = eagle1_tensors(hidden=32, vocab=97, inter=64, heads=2, kv_heads=1, dtype=torch.float32, scale=0.2)
    src = tmp_path / "src"
    src.mkdir()
    torch.save(sd, src / "pytorch_model.bin")
    cfg_src = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1,
               "num_hidden_layers": 1, "vocab_size": 97, "rms_norm_eps": 1e-6, "max_position_embeddings": 128}
    (src / "config.json").write_text(json.dumps(cfg_src))
    convert("eagle", str(src), tmp_path / "out", str(write_verifier(tmp_path / "v", hidden=32, vocab=97)))
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    head = model.lm_head.weight.detach()
    a = run_chain(model, PROMPTS, eagle1_proposer(sd, cfg, head, sd["embed_tokens.weight"]), k=3, max_tokens=10)
    b = run_chain(model, PROMPTS, eagle1_proposer(out, cfg, head, out["embed_tokens.weight"]), k=3, max_tokens=10)
    assert a.to_json() == b.to_json()
    # and the proposals depend on the bias: without it the draft proposes other tokens
    seq = [1, 5, 9, 3]
    states = verifier_states(model, seq)
    ctx = seq + [int(states.logits[-1].argmax())]
    no_bias = {k: v for k, v in sd.items() if k != "fc.bias"}
    props = [eagle1_proposer(t, cfg, head, sd["embed_tokens.weight"])(ctx, states, 4) for t in (sd, out, no_bias)]
    assert props[0] == props[1] != props[2]


def test_eagle1_cached_chain_drafts_what_a_full_pass_drafts():
    """The EAGLE-1 proposer keeps a transformers KV cache per sequence (issue 19): every call proposes what
    the whole prefix through the draft (:func:`eagle1_forward`, no cache) proposes, whatever the calls' order."""
    from builders import eagle1_tensors

    from specfmt.algorithms.eagle import eagle1_forward, eagle1_proposer
    from specfmt.algorithms.reference import VerifierStates

    sd = {k: v.double() for k, v in eagle1_tensors(hidden=32, vocab=97, inter=64, heads=2, kv_heads=1, layers=2, dtype=torch.float32, scale=0.3).items()}
    cfg = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 2,
           "vocab_size": 97, "rms_norm_eps": 1e-6, "max_position_embeddings": 128}
    torch.manual_seed(2)
    head, embed = torch.randn(97, 32, dtype=torch.float64), sd["embed_tokens.weight"]

    def plain(tokens, states, k):
        ids, feats, out = list(tokens[1:]), states.hidden[-1], []
        for _ in range(k):
            f = eagle1_forward(sd, cfg, embed[torch.tensor(ids)], feats)
            out.append(int((f[-1] @ head.T).argmax()))
            ids.append(out[-1])
            feats = torch.cat([feats, f[-1:]])
        return out

    seqs = [torch.randint(0, 97, (14,)).tolist() for _ in range(2)]
    passes = [VerifierStates([torch.randn(14, 32, dtype=torch.float64) for _ in range(3)], torch.randn(14, 97, dtype=torch.float64)) for _ in seqs]
    chain = eagle1_proposer(sd, cfg, head, embed)
    for i, n in [(0, 4), (1, 3), (0, 5), (0, 9), (1, 8), (0, 7), (1, 12), (0, 13)]:  # by 1-4 tokens, a step back
        assert chain(seqs[i][:n], passes[i].prefix(n - 1), 3) == plain(seqs[i][:n], passes[i].prefix(n - 1), 3), (i, n)
    assert len(chain._caches[passes[0].source].tokens) == 13  # the calls did run from the cache


def test_prompt_groups_fit_the_states_budget_and_do_not_change_the_figures(model):
    """Prompts advance side by side in groups whose verifier states fit a budget (issue 19's memory bound):
    one prompt's states here are (3 x 32 + 97) floats per position; the figures never depend on the grouping."""
    from specfmt.validation.acceptance import GROUP, group_size, run_chains

    per_position = (3 * 32 + 97) * 4
    assert group_size(model, 100) == GROUP
    assert group_size(model, 100, budget=3 * 100 * per_position) == 3
    assert group_size(model, 100, budget=per_position) == 1  # never less than one prompt at a time

    def first_only(tokens, states, k):
        g = greedy(model, tokens, k)
        return [g[0]] + [(t + 1) % 97 for t in g[1:]]

    prompts = PROMPTS + [[3, 3, 8, 1, 4], [9], [2, 6]]
    alone = [r.to_json() for r in run_chains(model, prompts, [first_only], k=2, max_tokens=7, group=1)]
    for group in (2, 3, None):
        assert [r.to_json() for r in run_chains(model, prompts, [first_only], k=2, max_tokens=7, group=group)] == alone
