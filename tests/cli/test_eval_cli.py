"""`posttrainllm eval --json` prints only JSON, and its perplexity matches an independent computation."""

import json
import math

import pytest
import torch
from harness import cli_args, run_args
from typer.testing import CliRunner

from posttrainllm.cli import app

runner = CliRunner()


def reference_ppl(model_dir, text, L):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    nll, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids), L):
            w = torch.tensor([ids[start : start + L]])
            if w.shape[1] < 2:
                continue
            logits = model(w).logits[0, :-1].float()
            nll += torch.nn.functional.cross_entropy(logits, w[0, 1:], reduction="sum").item()
            count += w.shape[1] - 1
    return math.exp(nll / count), len(ids)


def test_eval_json_matches_independent_perplexity(tiny_model_dir, text_file, alpaca_file, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text("def f(x):\n    return x * 2\n" * 30)
    r = runner.invoke(
        app,
        cli_args("eval", tiny_model_dir, None, None, "--text", str(other), text=text_file, max_length=48, json=True),
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    for path in (text_file, other):
        ppl, tokens = reference_ppl(tiny_model_dir, path.read_text(), 48)
        assert data[path.name]["perplexity"] == pytest.approx(ppl, rel=5e-3)
        assert data[path.name]["tokens"] == tokens
    r = runner.invoke(
        app,
        cli_args("eval", tiny_model_dir, sft_dataset=alpaca_file, max_length=256, json=True),
    )
    assert r.exit_code == 0, r.output
    sft = json.loads(r.stdout)["sft"]
    assert sft["loss"] > 0 and sft["examples"] == 32


def test_eval_scores_a_chat_set_on_its_assistant_turns(tiny_model_dir, tmp_path):
    """`--sft-dataset` takes conversations as sft does (messages or ShareGPT lines): the assistant's turns are scored,
    so a conversation and the same pair written as a conversational prompt/completion score the same."""
    from posttrainllm.evaluate import sft_completion_loss

    chats = [
        [{"role": "user", "content": f"Count to {n}."}, {"role": "assistant", "content": " ".join(map(str, range(n)))}]
        for n in (3, 5, 8)
    ]
    messages, pairs = tmp_path / "chat.jsonl", tmp_path / "pairs.jsonl"
    messages.write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats))
    pairs.write_text("".join(json.dumps({"prompt": c[:1], "completion": c[1:]}) + "\n" for c in chats))
    got = {}
    for path in (messages, pairs):
        args = cli_args("eval", tiny_model_dir, sft_dataset=path, max_length=128, json=True, precision="fp32")
        r = runner.invoke(app, args)
        assert r.exit_code == 0, r.output
        got[path.name] = json.loads(r.stdout)["sft"]
    assert got["chat.jsonl"]["examples"] == 3 and got["chat.jsonl"]["loss"] > 0
    assert got["chat.jsonl"]["loss"] == pytest.approx(got["pairs.jsonl"]["loss"], rel=1e-5)
    assert got["chat.jsonl"]["completion_tokens"] == got["pairs.jsonl"]["completion_tokens"]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    want = sft_completion_loss(
        model, AutoTokenizer.from_pretrained(tiny_model_dir), [{"messages": c} for c in chats], 128
    )
    assert got["chat.jsonl"]["loss"] == pytest.approx(want["loss"], rel=1e-4)


def test_eval_needs_something_to_evaluate(tiny_model_dir):
    r = runner.invoke(app, ["eval", "--model", str(tiny_model_dir)])
    assert r.exit_code == 2 and "--text" in r.output


def test_eval_missing_text_file(tiny_model_dir, tmp_path):
    r = runner.invoke(app, ["eval", "--model", str(tiny_model_dir), "--text", str(tmp_path / "none.txt")])
    assert r.exit_code == 2 and "none.txt" in r.output


@pytest.mark.smoke
def test_ood_eval_reports_before_and_after(tiny_model_dir, alpaca_file, text_file, tmp_path):
    out = tmp_path / "o"
    r = runner.invoke(
        app,
        run_args("sft", tiny_model_dir, alpaca_file, out, batch=4, max_length=256, ood_eval=text_file),
    )
    assert r.exit_code == 0, r.output
    res = json.loads((out / "eval_results.json").read_text())["ood"][text_file.name]
    before, _ = reference_ppl(tiny_model_dir, text_file.read_text(), 256)
    after, _ = reference_ppl(out, text_file.read_text(), 256)
    assert res["before"] == pytest.approx(before, rel=5e-3)
    assert res["after"] == pytest.approx(after, rel=5e-3)
    assert res["change_pct"] == pytest.approx(100 * (after / before - 1), abs=0.05)
    assert "out-of-domain perplexity" in r.output


def test_eval_shows_progress_lines_on_a_non_terminal_stderr_and_json_stays_clean(
    tiny_model_dir, text_file, monkeypatch
):
    from posttrainllm.evaluate import progress

    monkeypatch.setattr(progress, "PROGRESS_EVERY", 0.0)  # a line per batch (a long eval: every 30 s)
    args = ["--model", str(tiny_model_dir), "--text", str(text_file), "--max-length", "16", "--eval-batch-size", "2"]
    r = runner.invoke(app, ["eval", *args, "--json"])
    assert r.exit_code == 0, r.output
    assert "perplexity" in json.loads(r.stdout)[text_file.name]  # stdout: the JSON only
    lines = [line for line in r.stderr.splitlines() if line.startswith(f"eval: {text_file.name}: ")]
    windows = json.loads(r.stdout)[text_file.name]["windows"]
    size = f"{text_file.stat().st_size / 1e3:.1f} KB"  # the total is the file's size: windows are counted as read
    assert (
        len(lines) > 3
        and lines[0].endswith(f": 0 windows, 0% of {size} read")
        and lines[-1].endswith(f": {windows} windows, 100% of {size} read")
    ), lines[:2] + lines[-2:]


def test_scoring_memory_follows_the_batch_not_the_text():
    """Scoring 2M token ids (8 MB as int32) keeps no int64 copy of them all (16 MB): numpy's traced peak stays
    near one batch. A stand-in model returns zero logits over 2 classes (torch's memory is not traced)."""
    import tracemalloc
    from types import SimpleNamespace

    import numpy as np

    from posttrainllm.evaluate.scoring import _score_ids

    class Zeros(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, **_):
            return SimpleNamespace(logits=torch.zeros(*input_ids.shape, 2))

    ids = np.zeros(2_000_000, dtype=np.int32)
    tracemalloc.start()
    try:
        _score_ids(Zeros(), ids, 4096, 8, None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4_000_000, peak


def test_eval_memory_follows_the_read_chunk_not_the_file(tmp_path, monkeypatch):
    """A file 20x larger does not take 20x the memory: the text is read, tokenized and scored a chunk at a time
    (read size set small here). Python's traced peak (the text, the tokenizer's id lists, numpy's ids) of a 2 MB
    file stays within 1.5x that of a 100 KB one (measured: 1.03 MB and 1.18 MB); the whole-text path grew with the
    file (2.1 MB and 15.1 MB: all the ids, and their copies). A stand-in model returns zero logits (torch's memory is
    not traced)."""
    import tracemalloc
    from types import SimpleNamespace

    from conftest import CORPUS, build_tokenizer

    from posttrainllm import evaluate as ev
    from posttrainllm.evaluate import stream

    tok = build_tokenizer()

    class Zeros(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, **_):
            return SimpleNamespace(logits=torch.zeros(*input_ids.shape, len(tok)))

    monkeypatch.setattr(stream, "READ_BYTES", 16 << 10)
    line = ("\n".join(CORPUS) + "\n    indented, ünïcode\n").encode()
    peaks, results = {}, {}
    for k, size in enumerate((100_000, 100_000, 2_000_000)):  # the first run untraced (imports, caches)
        path = tmp_path / f"{size}.txt"
        path.write_bytes(line * (size // len(line)))
        if k == 0:
            ev.evaluate_files(Zeros(), tok, [str(path)], 256, progress=False)
            continue
        tracemalloc.start()
        try:
            results[size] = ev.evaluate_files(Zeros(), tok, [str(path)], 256, progress=False)[path.name]
            peaks[size] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert results[2_000_000]["tokens"] > 19 * results[100_000]["tokens"]  # the big file was all scored
    assert peaks[2_000_000] < 1.5 * peaks[100_000], peaks
