"""KL(reference ‖ model) per token (posttrainllm/evaluate/divergence.py): closed forms, evaluate_files,
`eval --reference`, and the forgetting report's KL column."""

from __future__ import annotations

import json
import math
import types

import pytest
import torch
import torch.nn.functional as F
from conftest import CORPUS, build_tiny_model, build_tokenizer
from harness import cli_args
from typer.testing import CliRunner

from posttrainllm import evaluate as ev
from posttrainllm.cli import app
from posttrainllm.errors import ModelError
from posttrainllm.evaluate.divergence import kl_sum

TEXT = " ".join(CORPUS * 6)


def test_kl_of_identical_logits_is_zero_and_of_a_uniform_shift_too():
    logits = torch.randn(7, 50)
    assert kl_sum(logits, logits)[0] == pytest.approx(0.0, abs=1e-9)
    assert kl_sum(logits, logits + 3.0)[0] == pytest.approx(0.0, abs=1e-5)  # softmax is shift invariant
    assert kl_sum(logits, logits)[1] == 7


def test_kl_of_a_one_token_logit_shift_has_its_closed_form():
    """q = softmax(l + δ e_k): KL(p ‖ q) = log(1 − p_k + p_k e^δ) − δ p_k at every position."""
    torch.manual_seed(1)
    logits, k, delta = torch.randn(5, 30, dtype=torch.float64), 4, 1.7
    shifted = logits.clone()
    shifted[:, k] += delta
    p_k = F.softmax(logits, -1)[:, k]
    expected = (torch.log(1 - p_k + p_k * math.exp(delta)) - delta * p_k).sum().item()
    total, count = kl_sum(logits, shifted)
    assert count == 5 and total == pytest.approx(expected, rel=1e-5)
    # not symmetric: KL(q ‖ p) is another number
    assert kl_sum(shifted, logits)[0] != pytest.approx(expected, rel=1e-3)


def test_kl_honours_the_mask_and_refuses_other_vocabularies():
    a, b = torch.randn(4, 20), torch.randn(4, 20)
    mask = torch.tensor([True, False, True, False])
    full = [kl_sum(a[i : i + 1], b[i : i + 1])[0] for i in range(4)]
    total, count = kl_sum(a, b, mask)
    assert count == 2 and total == pytest.approx(full[0] + full[2], rel=1e-6)
    assert kl_sum(torch.randn(3, 22), torch.randn(3, 20))[1] == 3  # a model that gained 2 rows (pad/EOS)
    with pytest.raises(ModelError, match="same tokenizer"):
        kl_sum(torch.randn(3, 200), torch.randn(3, 20))


class _Shifted(torch.nn.Module):
    """The reference model with δ added to one token's logit: a tuned model whose KL is known."""

    def __init__(self, base, k: int, delta: float):
        super().__init__()
        self.base, self.k, self.delta = base, k, delta

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        logits = self.base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits.clone()
        logits[..., self.k] += self.delta
        return types.SimpleNamespace(logits=logits)


@pytest.fixture(scope="module")
def tok_and_model():
    tok = build_tokenizer()
    torch.manual_seed(0)
    return tok, build_tiny_model(tok, n_layers=2).eval()


def test_evaluate_files_reports_zero_kl_against_itself_and_the_analytic_kl_of_a_shift(tok_and_model):
    tok, model = tok_and_model
    same = ev.evaluate_files(model, tok, {"t": TEXT}, 24, progress=False, reference=model)["t"]
    assert same["kl"] == pytest.approx(0.0, abs=1e-7)
    k, delta = 7, 2.0
    shifted = ev.evaluate_files(_Shifted(model, k, delta), tok, {"t": TEXT}, 24, progress=False, reference=model)["t"]
    # the closed form at every predicted position, from the reference's own probabilities
    ids = ev._tokenize_text(tok, TEXT)
    expected, n = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(ids), 24):
            w = torch.tensor(ids[s : s + 24], dtype=torch.long)[None]
            if w.shape[1] < 2:
                continue
            p_k = F.softmax(model(input_ids=w).logits[0, :-1].double(), -1)[:, k]
            expected += (torch.log(1 - p_k + p_k * math.exp(delta)) - delta * p_k).sum().item()
            n += w.shape[1] - 1
    assert shifted["predicted_tokens"] == n
    assert shifted["kl"] == pytest.approx(expected / n, rel=1e-4)
    # without a reference: no KL key at all (old results keep their shape)
    assert "kl" not in ev.evaluate_files(model, tok, {"t": TEXT}, 24, progress=False)["t"]


def test_memory_of_the_kl_follows_the_batch_not_the_text(tok_and_model, monkeypatch):
    """The reference runs on each batch the model scores: never on more windows than --eval-batch-size."""
    tok, model = tok_and_model
    seen = []

    class Spy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, input_ids, attention_mask=None, use_cache=False):
            seen.append(input_ids.shape[0])
            return self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)

    ev.evaluate_files(model, tok, {"t": TEXT * 4}, 16, progress=False, reference=Spy(), batch_size=3)
    assert len(seen) > 3 and max(seen) <= 3


def test_forgetting_report_carries_the_kl():
    before = {"code": {"perplexity": 10.0}}
    after = {"code": {"perplexity": 11.0, "kl": 0.05}}
    r = ev.forgetting_report(before, after)["code"]
    assert r["change_pct"] == pytest.approx(10.0) and r["kl"] == 0.05


def _save(model, tok, path):
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_eval_reference_cli_json(tmp_path, tok_and_model):
    tok, model = tok_and_model
    a = _save(model, tok, tmp_path / "a")
    torch.manual_seed(5)
    other = build_tiny_model(tok, n_layers=2)
    b = _save(other, tok, tmp_path / "b")
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    runner = CliRunner()
    base = ["eval", "--text", str(text), "--max-length", "24", "--json"]
    r_same = runner.invoke(app, [*base, "--model", a, "--reference", a])
    assert r_same.exit_code == 0, r_same.output
    same = json.loads(r_same.stdout)["t.txt"]
    assert same["kl"] == pytest.approx(0.0, abs=1e-7)
    r_other = runner.invoke(app, [*base, "--model", b, "--reference", a])
    assert r_other.exit_code == 0, r_other.output
    assert json.loads(r_other.stdout)["t.txt"]["kl"] > 1e-3
    # a missing reference is a usage error before anything loads
    r_missing = runner.invoke(app, [*base, "--model", a, "--reference", str(tmp_path / "nope")])
    assert r_missing.exit_code == 2 and "--reference" in r_missing.output


def test_eval_reference_with_another_tokenizer_is_refused(tmp_path, tok_and_model):
    tok, model = tok_and_model
    a = _save(model, tok, tmp_path / "a")
    tok2 = build_tokenizer(["zzz yyy xxx www"] * 10, vocab_size=300)
    torch.manual_seed(2)
    b = _save(build_tiny_model(tok2, n_layers=2), tok2, tmp_path / "b")
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    r = CliRunner().invoke(app, cli_args("eval", a, reference=b, text=text, max_length=24, json=True))
    assert r.exit_code == 2 and "tokenizes text differently" in r.output
