"""``specfmt train --hidden-states``: the loss mask of every objective, batches from hidden-states data, and
a draft trained from such data equal to one trained from the verifier's own forward."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from specfmt.algorithms import get
from specfmt.sources.verifier import Verifier

WORLD = Path(__file__).resolve().parents[1] / "examples" / "world"


@pytest.fixture(scope="module")
def verifier() -> Verifier:
    return Verifier.load(str(WORLD / "verifier"))


def _module(name: str, verifier: Verifier, **opts):
    algo = get(name).training
    options = algo.parse_options(opts or None, init=False)
    cfg = algo.new_config(verifier, algo.new_shape(replace(options, dtype="float32")))
    tensors, _ = algo.new_draft(cfg, verifier, None)
    torch.manual_seed(0)
    module = get(name).reference.module(cfg, {n: t.float() for n, t in tensors.items()}).float()
    for p in module.parameters():  # new drafts start with zero blocks (Medusa): make every position's loss differ
        p.data.add_(torch.randn_like(p) * 0.05)
    return algo, options, module


def _batch(verifier: Verifier, B: int = 2, T: int = 12):
    g = torch.Generator().manual_seed(1)
    V, H = verifier.info.vocab_size, verifier.info.hidden_size
    ids = torch.randint(0, V, (B, T), generator=g)
    aux = torch.randn(B, T, 3 * H, generator=g)
    last = torch.randn(B, T, H, generator=g)
    return ids, aux, last


def _loss(algo, options, module, verifier, batch, mask):
    ids, aux, last = batch
    embed = verifier.embedding().float()
    head = torch.nn.Linear(embed.shape[1], embed.shape[0], bias=False)
    head.weight.data = verifier.lm_head().float()
    kw = {"loss_mask": mask} if mask is not None else {}
    loss, correct, counted = algo.loss(module, embed=module.embed_tokens if getattr(module, "embed_tokens", None) is not None else embed,
                                       head=head, ids=ids, aux=aux if algo.feature_taps(module.cfg) else None, last=last,
                                       options=options, generator=torch.Generator().manual_seed(0), subset=None, **kw)
    return loss.detach(), correct, counted


CASES = [("eagle3", {"ttt_steps": 1}), ("eagle", {}), ("medusa", {"heads": 1})]


@pytest.mark.parametrize("name,opts", CASES + [("eagle3", {"ttt_steps": 3}), ("medusa", {"heads": 3})])
def test_all_ones_mask_is_no_mask(verifier, name, opts):
    algo, options, module = _module(name, verifier, **opts)
    batch = _batch(verifier)
    a = _loss(algo, options, module, verifier, batch, None)
    b = _loss(algo, options, module, verifier, batch, torch.ones(batch[0].shape, dtype=torch.bool))
    assert torch.equal(a[0], b[0]) and a[1:] == b[1:]


@pytest.mark.parametrize("name,opts", CASES)
def test_masked_loss_is_the_mean_over_kept_targets(verifier, name, opts):
    """One draft position: each target position's loss alone (a mask keeping it only); the masked loss is their
    mean over the kept targets, and the position-0 mask gates nothing (no prediction targets position 0)."""
    algo, options, module = _module(name, verifier, **opts)
    batch = _batch(verifier, B=1, T=10)
    T = batch[0].shape[1]
    single = {}
    for t in range(1, T):
        m = torch.zeros(1, T, dtype=torch.bool)
        m[0, t] = True
        loss, correct, counted = _loss(algo, options, module, verifier, batch, m)
        assert counted == [1]
        single[t] = loss.item()
    assert len(set(single.values())) == T - 1  # the positions' losses differ: a wrong alignment would show
    keep = [2, 3, 7, 9]
    m = torch.zeros(1, T, dtype=torch.bool)
    m[0, keep] = True
    loss, correct, counted = _loss(algo, options, module, verifier, batch, m)
    assert counted == [len(keep)]
    assert loss.item() == pytest.approx(sum(single[t] for t in keep) / len(keep), rel=1e-5)
    m[0, 0] = True  # position 0 is no prediction's target
    again = _loss(algo, options, module, verifier, batch, m)
    assert torch.equal(again[0], loss) and again[2] == counted
    none = _loss(algo, options, module, verifier, batch, None)
    assert none[0].item() == pytest.approx(sum(single.values()) / len(single), rel=1e-5)


# -- hidden-states data, written as speculators 0.9 lays it out ----------------------------------------------


def write_hidden_states(folder: Path, verifier_dir: Path, samples: list[list[int]], taps: list[int], masks: list[list[int]] | None = None,
                        manifest: bool = True) -> Path:
    """Hidden-states data in speculators 0.9's layout as ``specfmt datagen`` writes it, through its parts
    (:mod:`specfmt.datagen.layout`: the preprocessed dataset, ``token_freq.pt``, with ``manifest`` specfmt's manifest;
    the transformers engine, :class:`specfmt.datagen.hf_engine.TransformersEngine`: ``hs_{i}.safetensors`` with the
    taps and layer L before the final norm), from samples given exactly."""
    from specfmt.datagen import layout

    verifier = Verifier.load(str(verifier_dir))
    L = verifier.info.num_hidden_layers
    rows = [layout.Sample(s, m) for s, m in zip(samples, masks or [[1] * len(s) for s in samples])]
    layout.write_preprocessed(rows, folder)
    layout.write_token_freq(rows, folder / layout.TOKEN_FREQ)
    write_hs_files(verifier, layout.hidden_states_folder(folder), samples, list(taps) + [L])
    if manifest:
        layout.write_manifest(folder, layout.Manifest(verifier=str(verifier_dir), layers=list(taps) + [L], hidden_size=verifier.info.hidden_size,
                                                      engine="transformers", seq_len=max(map(len, samples)), dtype="float32",
                                                      samples=len(samples), tokens=sum(map(len, samples))))
    return folder


def write_hs_files(verifier: Verifier, hs_dir: Path, samples: list[list[int]], layers: list[int]) -> None:
    """``hs_dir/hs_{i}.safetensors`` of each sample by the transformers engine (float32, CPU)."""
    from specfmt.datagen.hf_engine import TransformersEngine

    engine = TransformersEngine(verifier)
    try:
        assert [i for i, _ in engine.extract(list(enumerate(samples)), layers, hs_dir)] == list(range(len(samples)))
    finally:
        engine.close()


@pytest.fixture(scope="module")
def world_windows(verifier, tmp_path_factory):
    """A short text (the start of the example world's README) and its tokens as ``--data`` reads them."""
    from specfmt.training.data import read_documents

    text = tmp_path_factory.mktemp("text") / "train.txt"
    text.write_text((WORLD / "README.md").read_text()[:1500])
    docs = read_documents([str(text)], verifier.tokenizer())
    return text, docs


@pytest.mark.parametrize("algo,opts", [("eagle3", {})])
def test_hidden_states_train_equals_data_train(tmp_path, verifier, world_windows, algo, opts):
    """Samples that are exactly ``--data``'s fixed windows (``--cache``: offset 0), loss mask all ones: a draft
    trained from the hidden states equals, step for step, one trained from the verifier's forward (float32:
    identical losses and tensors; the bound is 0)."""
    from specfmt.training.loop import TrainOptions
    from specfmt.training.pipeline import TrainRequest, train_draft

    text, docs = world_windows
    T = 32
    stream = [t for d in docs.ids for t in d]
    n = (len(stream) - T) // T
    samples = [stream[i * T:(i + 1) * T] for i in range(n)]
    taps = [2, 4, 5]
    hs = write_hidden_states(tmp_path / "hs", WORLD / "verifier", samples, taps)
    opts_t = TrainOptions(steps=4, batch_size=2, seq_len=T, lr=1e-3, seed=3, save_every=0)
    runs = {}
    for how, kw in (("data", {"data": [str(text)], "cache": str(tmp_path / "cache")}), ("hs", {"hidden_states": str(hs)})):
        losses = []
        req = TrainRequest(str(tmp_path / f"out-{how}"), str(WORLD / "verifier"), algorithm=algo, device="cpu", validate=False,
                           **({"taps": taps} if algo == "eagle3" else {}), **opts, **kw)
        res = train_draft(req, opts_t, log=lambda step, loss, acc: losses.append((loss, acc)))
        runs[how] = (losses, res.draft.tensors)
    assert runs["data"][0] == runs["hs"][0]
    assert runs["data"][1].keys() == runs["hs"][1].keys()
    for name, t in runs["data"][1].items():
        assert torch.equal(t, runs["hs"][1][name]), name


def test_refusals(tmp_path):
    """One line each: a tap the data lacks, a last layer that is not L, --hidden-states with --data, a file whose
    token ids are not the dataset's."""
    from specfmt.errors import InputError
    from specfmt.training.hsdata import HiddenStateBatches, tap_positions
    from specfmt.training.pipeline import TrainRequest, check_request

    assert tap_positions([2, 5], [2, 4, 5, 8], 4, 8) == [0, 2]
    assert tap_positions([2, 4, 5], None, 4, 8) == [0, 1, 2]
    with pytest.raises(InputError, match=r"tap layer\(s\) \[3\]; the hidden states hold \[2, 4, 5\]"):
        tap_positions([2, 3], [2, 4, 5, 8], 4, 8)
    with pytest.raises(InputError, match="the last stored layer is 7, not the verifier's last"):
        tap_positions([2], [2, 7], 2, 8)
    with pytest.raises(InputError, match="hold 2 tap layers, the draft reads 3"):
        tap_positions([1, 2, 3], None, 3, 8)
    with pytest.raises(InputError, match="goes with neither --data nor --cache"):
        check_request(TrainRequest("o", "v", algorithm="eagle3", data=["x"], hidden_states="hs"))
    hs = write_hidden_states(tmp_path / "hs", WORLD / "verifier", [[5, 6, 7, 8], [9, 10, 11]], [2, 4, 5])
    from safetensors.torch import load_file, save_file

    f = hs / "hidden_states" / "hs_1.safetensors"
    t = load_file(str(f))
    save_file({"hidden_states": t["hidden_states"], "token_ids": torch.tensor([9, 10, 12])}, str(f))
    data = HiddenStateBatches(hs, 4, 2, 0, taps=[2, 4, 5], n_layers=8, norm=lambda x: x)
    ids, mask, h = data.sample(0)
    assert ids.tolist() == [5, 6, 7, 8] and mask.all() and h.shape == (4, 4, 128)
    with pytest.raises(InputError, match="sample 1: the file.s token ids differ from the input ids at position 2"):
        data.sample(1)


def test_cli_trains_from_hidden_states_and_refuses_them_with_data(tmp_path):
    """``specfmt train eagle --hidden-states DIR`` trains (EAGLE-1 reads the last layer only, normed by the verifier's
    final norm) and writes a draft; with ``--data`` as well it fails in one line before anything is written."""
    import json

    from typer.testing import CliRunner

    from specfmt.cli import app

    hs = write_hidden_states(tmp_path / "hs", WORLD / "verifier", [list(range(3, 19)), list(range(40, 52))], [2],
                             masks=[[0] * 4 + [1] * 12, [1] * 12])
    base = ["train", "eagle", "--verifier", str(WORLD / "verifier"), "--hidden-states", str(hs), "--steps", "2", "--batch-size", "2",
            "--seq-len", "16", "--device", "cpu", "--no-validate"]
    r = CliRunner().invoke(app, base + ["-o", str(tmp_path / "out")], terminal_width=200)
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["specfmt"]["train"]["steps"] == 2
    r = CliRunner().invoke(app, base + ["-o", str(tmp_path / "out2"), "--data", str(WORLD / "README.md")], terminal_width=200)
    assert r.exit_code != 0 and "goes with neither --data nor --cache" in r.output, r.output
    assert not (tmp_path / "out2").exists()


@pytest.mark.parametrize("world", ["world", "world-qwen3"])
def test_final_norm_is_the_verifiers_own(world):
    """``final_norm`` (transformers' RMSNorm class of the model type, the verifier's weight and eps) turns the stored
    layer L (before the norm) into exactly the transformers forward's last hidden state, on both example worlds."""
    from specfmt.datagen.hf_engine import TransformersEngine
    from specfmt.training.data import final_norm

    v = Verifier.load(str(WORLD.parent / world / "verifier"))
    L = v.info.num_hidden_layers
    ids = list(range(5, 25))
    engine = TransformersEngine(v)
    pre = engine.forward(ids, [L])[:, 0]
    with torch.no_grad():
        want = engine._load().get_decoder()(input_ids=torch.tensor([ids]), use_cache=False).last_hidden_state[0]
        got = final_norm(v)(pre)
    engine.close()
    assert type(final_norm(v)).__name__ == {"world": "LlamaRMSNorm", "world-qwen3": "Qwen3RMSNorm"}[world]
    assert torch.equal(got, want)


def test_samples_are_dealt_like_windows():
    """The rows of a step are a function of the step: every epoch a permutation seeded by (seed, epoch), two ranks
    never share a sample within a step, and rank r's step s equals what one process sees at flat position (s·W + r)."""
    from specfmt.training.hsdata import HiddenStateBatches

    def deal(world, rank, seed=5):
        d = object.__new__(HiddenStateBatches)
        d.n, d.batch, d.seed, d.world, d.rank, d._perm = 7, 2, seed, world, rank, None
        d.held, d._pool = [], None  # no held-out split (HiddenStateBatches(heldout=0))
        return d

    one = deal(1, 0)
    flat = [i for s in range(7) for _, i in one.indices(s)]  # 14 rows: two epochs
    assert sorted(flat[:7]) == list(range(7)) and sorted(flat[7:]) == list(range(7)) and flat[:7] != flat[7:]
    r0, r1 = deal(2, 0), deal(2, 1)
    for s in range(3):
        a, b = [i for _, i in r0.indices(s)], [i for _, i in r1.indices(s)]
        assert a == [i for _, i in one.indices(2 * s)] and b == [i for _, i in one.indices(2 * s + 1)]
    assert [i for _, i in deal(1, 0).indices(5)] == [i for _, i in one.indices(5)]  # a fresh object (resume) agrees
    assert [i for s in range(4) for _, i in deal(1, 0, seed=6).indices(s)][:7] != flat[:7]
