"""The base's held-out evaluation cached once and reused (posttrainllm/evaluate/base_cache.py): the cached KL equals
the exact KL when k covers the vocabulary, is a lower bound below it, the base runs once per text, and a changed
text or base gets a new entry."""

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
def test_cached_kl_below_the_vocabulary_is_a_lower_bound_that_tightens_with_k(tmp_path, models, k):
    tok, base, tuned = models
    paths = _files(tmp_path, TEXT)
    exact = ev.evaluate_files(tuned, tok, paths, 24, progress=False, reference=base)["held0.txt"]["kl"]
    kls = []
    for kk in (k, 4 * k):
        _, after = evaluate_against_base(
            tuned, tok, paths, 24, cache_dir=tmp_path / f"c{kk}", base_identity="b", load_base=lambda: base, top_k=kk
        )
        kls.append(after["held0.txt"]["kl"])
    assert 0 <= kls[0] <= kls[1] + 1e-9 <= exact + 2e-9  # grouping outcomes never raises a divergence


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
