"""The base's held-out evaluation cached once and reused (posttrainllm/evaluate/base_cache.py): the cached KL equals
the exact KL when k covers the vocabulary, estimates the tail without bias below it, the base runs once per text,
and a changed text or base gets a new entry."""

from __future__ import annotations

import pytest
import torch
from conftest import CORPUS, build_tiny_model, build_tokenizer

from posttrainllm import evaluate as ev
from posttrainllm.evaluate.base_cache import evaluate_against_base

TEXT = " ".join(CORPUS * 6)


@pytest.fixture(scope="module")
def models():
    tok = build_tokenizer()
    torch.manual_seed(0)
    base = build_tiny_model(tok, n_layers=2).eval()
    torch.manual_seed(1)
    tuned = build_tiny_model(tok, n_layers=2).eval()
    with torch.no_grad():  # a tuned model near the base, as after fine-tuning
        for pb, pt in zip(base.parameters(), tuned.parameters()):
            pt.copy_(pb + 0.3 * (pt - pb))
    return tok, base, tuned


class Counting(torch.nn.Module):
    """The base, counting its forward passes (windows run)."""

    def __init__(self, model):
        super().__init__()
        self.m, self.windows = model, 0

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        self.windows += input_ids.shape[0]
        return self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)


def _files(tmp_path, *texts):
    paths = []
    for i, t in enumerate(texts):
        p = tmp_path / f"held{i}.txt"
        p.write_text(t)
        paths.append(str(p))
    return paths


def test_cached_kl_equals_the_exact_kl_when_k_covers_the_vocabulary(tmp_path, models):
    tok, base, tuned = models
    paths = _files(tmp_path, TEXT, TEXT[::-1])
    exact_before = ev.evaluate_files(base, tok, paths, 24, progress=False)
    exact = ev.evaluate_files(tuned, tok, paths, 24, progress=False, reference=base)
    before, after = evaluate_against_base(
        tuned, tok, paths, 24, cache_dir=tmp_path / "c", base_identity="b", load_base=lambda: base, top_k=10_000
    )
    for name in exact:
        assert exact[name]["kl"] > 1e-4  # the models do differ
        assert after[name]["kl"] == pytest.approx(exact[name]["kl"], rel=1e-6)
        assert after[name]["perplexity"] == pytest.approx(exact[name]["perplexity"], rel=1e-6)
        assert before[name]["perplexity"] == pytest.approx(exact_before[name]["perplexity"], rel=1e-6)


@pytest.mark.parametrize("k", [1, 8, 64])
def test_below_the_vocabulary_the_tail_is_estimated_without_bias(tmp_path, models, k):
    """The top k exactly, the rest from 64 draws per position: across the text's positions the estimate lands near
    the exact KL at every k (the old lumped tail read 42% low on a tiny model), and a model against itself is 0."""
    tok, base, tuned = models
    paths = _files(tmp_path, TEXT)
    exact = ev.evaluate_files(tuned, tok, paths, 24, progress=False, reference=base)["held0.txt"]["kl"]
    kw = {"base_identity": "b", "load_base": lambda: base, "top_k": k}
    _, after = evaluate_against_base(tuned, tok, paths, 24, cache_dir=tmp_path / f"c{k}", **kw)
    _, itself = evaluate_against_base(base, tok, paths, 24, cache_dir=tmp_path / f"c{k}", **kw)
    assert after["held0.txt"]["kl"] == pytest.approx(exact, rel=0.01)
    assert itself["held0.txt"]["kl"] == 0.0


def test_the_tail_draws_follow_the_base_outside_its_top_k():
    from posttrainllm.evaluate.base_cache import top_and_tail

    torch.manual_seed(0)
    logp = torch.log_softmax(torch.randn(3, 50) * 2, dim=-1)
    gen = torch.Generator().manual_seed(0)
    idx, top, drawn, drawn_logp = top_and_tail(logp, 5, 20_000, gen)
    for t in range(3):
        inside = set(idx[t].tolist())
        assert not inside & set(drawn[t].tolist())  # never a top token
        assert torch.equal(top[t], logp[t].topk(5).values)
        rest = logp[t].exp().clone()
        rest[idx[t].long()] = 0
        freq = torch.bincount(drawn[t].long(), minlength=50).float() / 20_000
        assert torch.allclose(freq, rest / rest.sum(), atol=0.02)  # drawn as the base's distribution over the rest
        assert torch.equal(drawn_logp[t], logp[t, drawn[t].long()])
    again = top_and_tail(logp, 5, 20_000, torch.Generator().manual_seed(0))[2]
    assert torch.equal(again, drawn)  # the same draws for the same seed
    assert top_and_tail(logp, 50, 64, gen)[2].shape == (3, 0)  # no tail: nothing drawn, the KL exact


def test_the_base_runs_once_per_text_however_many_models_are_measured(tmp_path, models):
    tok, base, tuned = models
    paths = _files(tmp_path, TEXT, TEXT[: len(TEXT) // 2])
    counting, loads = Counting(base), []

    def load():
        loads.append(1)
        return counting

    results = []
    for model in (tuned, base, tuned):
        results.append(
            evaluate_against_base(model, tok, paths, 24, cache_dir=tmp_path / "c", base_identity="b", load_base=load)
        )
    windows_per_pass = sum(r["windows"] for r in ev.evaluate_files(base, tok, paths, 24, progress=False).values())
    assert len(loads) == 1 and counting.windows == windows_per_pass
    assert results[1][1]["held0.txt"]["kl"] == pytest.approx(0.0, abs=1e-6)  # the base against itself
    assert results[0][1] == results[2][1]


def test_a_changed_text_or_base_is_evaluated_again(tmp_path, models):
    tok, base, tuned = models
    (path,) = _files(tmp_path, TEXT)
    counting = Counting(base)

    def run(identity="b"):
        return evaluate_against_base(
            tuned, tok, [path], 24, cache_dir=tmp_path / "c", base_identity=identity, load_base=lambda: counting
        )

    run()
    first = counting.windows
    run()
    assert counting.windows == first  # cached
    with open(path, "a") as f:
        f.write(" def more(x): return x * 2\n" * 20)
    changed = run()
    assert counting.windows > first  # a changed text is a new entry
    exact = ev.evaluate_files(tuned, tok, [path], 24, progress=False, reference=base)["held0.txt"]
    assert changed[1]["held0.txt"]["predicted_tokens"] == exact["predicted_tokens"]
    seen = counting.windows
    run(identity="another base")
    assert counting.windows > seen


# ------------------------------------------------------------------ identity by whole content; entries that heal
def _model_dir(tmp_path, name: str, size: int = 4 << 20):
    """A directory with a 'weights' file big enough that a sampled digest reads only part of it."""
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "llama"}')
    (d / "model.safetensors").write_bytes(bytes(range(256)) * (size // 256))
    return d


def test_bases_that_differ_in_one_byte_anywhere_get_two_identities(tmp_path):
    from posttrainllm.evaluate.base_cache import content_identity

    a, b = _model_dir(tmp_path, "a"), _model_dir(tmp_path, "b")
    assert content_identity(str(a)) == content_identity(str(b))
    data = bytearray((b / "model.safetensors").read_bytes())
    data[len(data) // 3 + 12345] ^= 1  # one bit, between the pieces a sampled digest reads
    (b / "model.safetensors").write_bytes(bytes(data))
    assert content_identity(str(a)) != content_identity(str(b))


def test_the_identity_is_remembered_by_size_and_mtime_and_redone_on_change(tmp_path, monkeypatch):
    import os

    from posttrainllm.evaluate import base_cache
    from posttrainllm.rundir import layout

    d = _model_dir(tmp_path, "m")
    reads = []
    real = layout.sha256
    monkeypatch.setattr(layout, "sha256", lambda p: reads.append(p) or real(p))
    first = base_cache.content_identity(str(d), tmp_path / "cache")
    n = len(reads)
    assert n == 2 and base_cache.content_identity(str(d), tmp_path / "cache") == first and len(reads) == n
    weights = d / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[7] ^= 1
    st = weights.stat()
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert base_cache.content_identity(str(d), tmp_path / "cache") != first and len(reads) == n + 1


@pytest.mark.parametrize("damage", ["truncate_logp", "drop_counts", "bad_json", "empty_json", "old_version"])
def test_a_damaged_entry_is_named_and_recorded_again(tmp_path, models, damage, capsys):
    import json

    tok, base, tuned = models
    paths = _files(tmp_path, TEXT)
    kw = {"cache_dir": tmp_path / "c", "base_identity": "b", "load_base": lambda: base}
    _, good = evaluate_against_base(tuned, tok, paths, 24, **kw)
    (entry,) = [p for p in (tmp_path / "c").iterdir() if p.is_dir()]
    if damage == "truncate_logp":
        f = entry / "topk_logp.bin"
        f.write_bytes(f.read_bytes()[:-8])
    elif damage == "drop_counts":
        (entry / "tail_sample_idx.bin").unlink()
    elif damage == "bad_json":
        (entry / "result.json").write_text('{"k": 3, "vocab"')
    elif damage == "empty_json":
        (entry / "result.json").write_text("[]")
    else:
        meta = json.loads((entry / "result.json").read_text())
        meta.pop("v")
        (entry / "result.json").write_text(json.dumps(meta))
    capsys.readouterr()
    _, again = evaluate_against_base(tuned, tok, paths, 24, **kw)
    err = capsys.readouterr().err
    assert f"eval cache: entry {entry}" in err and "recording it again" in err
    assert again["held0.txt"]["kl"] == pytest.approx(good["held0.txt"]["kl"], rel=1e-9)
    _, third = evaluate_against_base(tuned, tok, paths, 24, **kw)  # repaired: read without a word
    assert "eval cache" not in capsys.readouterr().err and third == again


def test_a_cache_folder_that_is_a_file_is_one_line(tmp_path, models):
    from posttrainllm.errors import DataError

    tok, base, tuned = models
    paths = _files(tmp_path, TEXT)
    (tmp_path / "c").write_text("not a folder")
    with pytest.raises(DataError, match=r"--eval-cache .*c is not a folder: name a folder"):
        evaluate_against_base(
            tuned, tok, paths, 24, cache_dir=tmp_path / "c", base_identity="b", load_base=lambda: base
        )
