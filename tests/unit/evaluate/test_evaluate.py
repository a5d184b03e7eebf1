"""Tests for posttrainllm.evaluate: perplexity definition, SFT completion loss, file evaluation, loading."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from posttrainllm import evaluate as ev  # noqa: E402
from posttrainllm.errors import DataError, UsageError  # noqa: E402

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A language model assigns probabilities to sequences of tokens.",
    "Perplexity is the exponential of the mean negative log-likelihood.",
    "Instruction: summarize the text. Response: a short summary.",
    "the cat sat on the mat and the dog sat on the log",
]

TEXT = (
    "The quick brown fox jumps over the lazy dog. A language model assigns probabilities to tokens. "
    "Perplexity is the exponential of the mean negative log-likelihood; the cat sat on the mat. "
    "Windows do not overlap, and every window is scored on its own without carried context."
)


# ------------------------------------------------------------------------------------------------ fixtures


def _make_tokenizer():
    from conftest import build_tokenizer

    return build_tokenizer(
        CORPUS,
        300,
        specials=["<pad>", "<s>", "</s>"],
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=16,
    )


def _make_model(vocab_size: int, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(cfg)
    # Random init is small; scale the head so the logits are far from uniform (a sharper test).
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    return model.eval()


@pytest.fixture(scope="module")
def tokenizer():
    return _make_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return _make_model(len(tokenizer))


# ------------------------------------------------------------------------------ independent reference


def reference_perplexity(model, ids: list[int], L: int) -> tuple[float, int, int]:
    """Straightforward loop over non-overlapping windows: (perplexity, predicted tokens, windows)."""
    total, count, windows = 0.0, 0, 0
    with torch.no_grad():
        for start in range(0, len(ids), L):
            window = torch.tensor([ids[start : start + L]])
            windows += 1
            if window.shape[1] < 2:
                continue
            logits = model(window).logits[0].float()
            total += F.cross_entropy(logits[:-1], window[0, 1:], reduction="sum").item()
            count += window.shape[1] - 1
    return math.exp(total / count), count, windows


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False, verbose=False).input_ids


def _lengths_for(n: int) -> dict[str, int]:
    """max_length values covering: exact multiple, 1-token last window, short last window, one window."""
    exact = next(L for L in range(7, n) if n % L == 0)
    one_left = next(L for L in range(5, n) if n % L == 1)
    short_left = next(L for L in range(9, n) if n % L not in (0, 1) and n % L < L // 2)
    return {"exact": exact, "one_left": one_left, "short_left": short_left, "single": n + 5, "two": 2}


# ----------------------------------------------------------------------------------------------- tests


def test_import_does_not_load_torch():
    code = (
        "import sys, posttrainllm.evaluate; bad = [m for m in ('torch', "
        "'transformers') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_text_long_enough(tokenizer):
    n = len(_ids(tokenizer, TEXT))
    assert n > 60  # the length cases below need a few windows
    cases = _lengths_for(n)
    assert n % cases["one_left"] == 1 and n % cases["short_left"] > 1 and n % cases["exact"] == 0


@pytest.mark.parametrize("case", ["exact", "one_left", "short_left", "single", "two"])
def test_perplexity_matches_reference(model, tokenizer, case):
    ids = _ids(tokenizer, TEXT)
    L = _lengths_for(len(ids))[case]
    ref_ppl, ref_count, ref_windows = reference_perplexity(model, ids, L)
    for bs in (1, 3, 8) if case != "two" else (1, 8):
        got = ev.text_perplexity(model, tokenizer, TEXT, L, batch_size=bs)
        assert got["perplexity"] == pytest.approx(ref_ppl, rel=1e-5), (case, L, bs)
        assert got["nll"] == pytest.approx(math.log(ref_ppl), rel=1e-5)
        assert got["predicted_tokens"] == ref_count
        assert got["windows"] == ref_windows == math.ceil(len(ids) / L)
        assert got["tokens"] == len(ids)
    # Non-overlapping windows: predicted tokens = tokens - number of windows.
    assert ref_count == len(ids) - math.ceil(len(ids) / L)


def test_window_length_matters(model, tokenizer):
    """Context is not carried across windows, so a different max_length gives a different value."""
    a = ev.text_perplexity(model, tokenizer, TEXT, 8)["perplexity"]
    b = ev.text_perplexity(model, tokenizer, TEXT, 64)["perplexity"]
    assert a != pytest.approx(b, rel=1e-4)


def test_counts_and_no_length_warning(model, tokenizer, caplog):
    # model_max_length is 16, the text is much longer: no "Token indices sequence length" warning.
    ids = tokenizer(TEXT, add_special_tokens=False, verbose=False).input_ids
    with caplog.at_level("WARNING"):
        got = ev.text_perplexity(model, tokenizer, TEXT, 10)
    assert "sequence length is longer" not in caplog.text
    assert got["tokens"] == len(ids)
    assert got["windows"] == math.ceil(len(ids) / 10)
    assert got["predicted_tokens"] == len(ids) - got["windows"]


def test_progress_callback_counts_windows(model, tokenizer):
    n = len(_ids(tokenizer, TEXT))
    L = _lengths_for(n)["one_left"]
    steps = []
    got = ev.text_perplexity(model, tokenizer, TEXT, L, batch_size=2, progress=steps.append)
    assert sum(steps) == got["windows"]
    assert len(steps) == math.ceil((n // L) / 2) + 1


def test_uniform_head_gives_vocab_size(tokenizer):
    """A zero lm_head gives uniform predictions: perplexity is exactly the vocabulary size."""
    m = _make_model(len(tokenizer), seed=1)
    with torch.no_grad():
        m.lm_head.weight.zero_()
    got = ev.text_perplexity(m, tokenizer, TEXT, 16)
    assert got["perplexity"] == pytest.approx(len(tokenizer), rel=1e-5)


def test_model_predicting_repeated_token_has_low_perplexity(model, tokenizer):
    text = "Q" * 40
    ids = _ids(tokenizer, text)
    assert len(set(ids)) == 1 and len(ids) == 40
    q = ids[0]
    biased = _make_model(len(tokenizer), seed=2)
    head = torch.nn.Linear(biased.config.hidden_size, len(tokenizer), bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[q] = 12.0
    biased.lm_head = head
    low = ev.text_perplexity(biased, tokenizer, text, 16)["perplexity"]
    high = ev.text_perplexity(model, tokenizer, text, 16)["perplexity"]
    expected = (len(tokenizer) - 1) * math.exp(-12.0) + 1.0  # 1 / softmax probability of q
    assert low == pytest.approx(expected, rel=1e-5)
    assert high > 10 * low
    # The biased model is bad at anything else.
    assert ev.text_perplexity(biased, tokenizer, TEXT, 16)["perplexity"] > 1000


def test_bf16_model_uses_float32_log_softmax(tokenizer):
    m = _make_model(len(tokenizer), seed=3).to(torch.bfloat16)
    ids = _ids(tokenizer, TEXT)
    ref, _, _ = reference_perplexity(m, ids, 20)  # reference upcasts the bf16 logits to float32
    got = ev.text_perplexity(m, tokenizer, TEXT, 20, batch_size=4)
    assert got["perplexity"] == pytest.approx(ref, rel=1e-4)


def test_eval_mode_and_training_flag_restored(tokenizer):
    m = _make_model(len(tokenizer), seed=4)
    m.config.attention_dropout = 0.5  # would make results random if left in train mode
    for layer in m.model.layers:
        layer.self_attn.attention_dropout = 0.5
    m.train()
    a = ev.text_perplexity(m, tokenizer, TEXT, 12)["perplexity"]
    assert m.training
    b = ev.text_perplexity(m, tokenizer, TEXT, 12)["perplexity"]
    assert a == b
    m.eval()
    assert ev.text_perplexity(m, tokenizer, TEXT, 12)["perplexity"] == pytest.approx(a, rel=1e-6)


def test_too_short_and_bad_arguments(model, tokenizer):
    with pytest.raises(DataError, match="too short"):
        ev.text_perplexity(model, tokenizer, "Q", 8)
    with pytest.raises(DataError):
        ev.text_perplexity(model, tokenizer, "", 8)
    with pytest.raises(UsageError):
        ev.text_perplexity(model, tokenizer, TEXT, 1)
    with pytest.raises(UsageError):
        ev.text_perplexity(model, tokenizer, TEXT, 8, batch_size=0)


# ------------------------------------------------------------------------------------------------ SFT

SFT_EXAMPLES = [
    {"prompt": "Question: what sat on the mat?\nAnswer:", "completion": " the cat"},
    {"prompt": "Summarize: the quick brown fox jumps over the lazy dog.\n", "completion": " A fox jumps."},
    {"prompt": "Say hi.", "completion": " Hello there, the dog sat on the log."},
]


def reference_sft(model, tokenizer, examples, max_length):
    total, count = 0.0, 0
    with torch.no_grad():
        for ex in examples:
            p = tokenizer(ex["prompt"]).input_ids
            c = tokenizer(ex["completion"], add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
            ids = (p + c)[:max_length]
            if len(ids) <= len(p):
                continue
            logits = model(torch.tensor([ids])).logits[0].float()
            targets = torch.tensor(ids[len(p) :])
            total += F.cross_entropy(logits[len(p) - 1 : len(ids) - 1], targets, reduction="sum").item()
            count += len(ids) - len(p)
    return total / count, count


@pytest.mark.parametrize("max_length", [128, 14])
def test_sft_loss_matches_manual(model, tokenizer, max_length):
    ref_loss, ref_count = reference_sft(model, tokenizer, SFT_EXAMPLES, max_length)
    for bs in (1, 2, 8):  # batch_size > 1 exercises right padding
        got = ev.sft_completion_loss(model, tokenizer, SFT_EXAMPLES, max_length, batch_size=bs)
        assert got["loss"] == pytest.approx(ref_loss, rel=1e-5)
        assert got["completion_tokens"] == ref_count
        assert got["examples"] == len(SFT_EXAMPLES)


def test_sft_counts_only_completion_tokens(model, tokenizer):
    expected = sum(len(tokenizer(e["completion"], add_special_tokens=False).input_ids) + 1 for e in SFT_EXAMPLES)
    got = ev.sft_completion_loss(model, tokenizer, SFT_EXAMPLES, 256)
    assert got["completion_tokens"] == expected
    # Changing (and lengthening) the end of the prompts changes the loss but not the scored-token count.
    changed = [dict(e, prompt=e["prompt"] + " the quick brown fox, the cat sat") for e in SFT_EXAMPLES]
    got2 = ev.sft_completion_loss(model, tokenizer, changed, 256)
    assert got2["completion_tokens"] == expected
    assert got2["loss"] != pytest.approx(got["loss"], rel=1e-6)


def test_sft_alpaca_format(model, tokenizer):
    from posttrainllm.data import ALPACA_PROMPT, ALPACA_PROMPT_NO_INPUT

    alpaca = [
        {"instruction": "Name an animal.", "input": "", "output": " A cat."},
        {"instruction": "Summarize.", "input": "The dog sat on the log.", "output": " Dog on log."},
    ]
    as_pc = [
        {
            "prompt": ALPACA_PROMPT_NO_INPUT.format(instruction=alpaca[0]["instruction"]),
            "completion": alpaca[0]["output"],
        },
        {
            "prompt": ALPACA_PROMPT.format(instruction=alpaca[1]["instruction"], input=alpaca[1]["input"]),
            "completion": alpaca[1]["output"],
        },
    ]
    want = ev.sft_completion_loss(model, tokenizer, as_pc, 256, batch_size=2)
    assert ev.sft_completion_loss(model, tokenizer, alpaca, 256, batch_size=2) == pytest.approx(want)


CHATS = [
    [{"role": "user", "content": "Name an animal."}, {"role": "assistant", "content": "A cat sat on the mat."}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Summarize the text."},
        {"role": "assistant", "content": "A short summary."},
        {"role": "user", "content": "Shorter."},
        {"role": "assistant", "content": "Summary."},
    ],
]


def _chat_reference(model, tokenizer, chats):
    """NLL of the assistant turns computed by hand: the conversation's tokens, and for each assistant turn the span
    between the render of the turns before it (with the generation prompt) and the render through it."""

    def ids_of(messages, generation):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
        return tokenizer(text, add_special_tokens=False).input_ids

    total, count = 0.0, 0
    with torch.no_grad():
        for chat in chats:
            full = ids_of(chat, False)
            logits = model(torch.tensor([full])).logits[0].float()
            for k, m in enumerate(chat):
                if m["role"] != "assistant":
                    continue
                a, b = len(ids_of(chat[:k], True)), len(ids_of(chat[: k + 1], False))
                total += F.cross_entropy(logits[a - 1 : b - 1], torch.tensor(full[a:b]), reduction="sum").item()
                count += b - a
    return total / count, count


def test_sft_loss_of_conversations_is_on_the_assistants_turns(model, tokenizer):
    import copy

    from posttrainllm.data import ensure_chat_template

    tok = copy.deepcopy(tokenizer)
    ensure_chat_template(tok)  # what the evaluation gives a tokenizer without a template
    want, n = _chat_reference(model, tok, CHATS)
    for bs in (1, 2):
        got = ev.sft_completion_loss(
            model, copy.deepcopy(tokenizer), [{"messages": c} for c in CHATS], 256, batch_size=bs
        )
        assert got["loss"] == pytest.approx(want, rel=1e-5) and got["completion_tokens"] == n
    # the same conversations as ShareGPT rows, and the first as a conversational prompt/completion pair
    roles = {"system": "system", "user": "human", "assistant": "gpt"}
    sharegpt = [{"conversations": [{"from": roles[m["role"]], "value": m["content"]} for m in c]} for c in CHATS]
    assert ev.sft_completion_loss(model, copy.deepcopy(tokenizer), sharegpt, 256)["loss"] == pytest.approx(want)
    pair = {"prompt": CHATS[0][:1], "completion": CHATS[0][1:]}
    one, _ = _chat_reference(model, tok, CHATS[:1])
    assert ev.sft_completion_loss(model, copy.deepcopy(tokenizer), [pair], 256)["loss"] == pytest.approx(one)


def test_sft_errors(model, tokenizer):
    with pytest.raises(DataError, match="example 2"):
        ev.sft_completion_loss(model, tokenizer, [SFT_EXAMPLES[0], {"text": "x"}], 64)
    with pytest.raises(DataError, match="no completion tokens"):
        ev.sft_completion_loss(model, tokenizer, [], 64)
    # Prompt fills max_length: nothing to score.
    with pytest.raises(DataError, match="no completion tokens"):
        ev.sft_completion_loss(model, tokenizer, [{"prompt": TEXT, "completion": " x"}], 8)


# ------------------------------------------------------------------------------------ files and reports


def test_evaluate_files_names_and_values(model, tokenizer, tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    texts = {"a/val.txt": TEXT, "b/val.txt": CORPUS[1] + " " + CORPUS[2], "other.txt": CORPUS[3]}
    for rel, content in texts.items():
        (tmp_path / rel).write_text(content, encoding="utf-8")
    paths = [str(tmp_path / rel) for rel in texts]
    out = ev.evaluate_files(model, tokenizer, paths, 16, sft_examples=SFT_EXAMPLES, progress=True)
    assert list(out) == ["a/val.txt", "b/val.txt", "other.txt", "sft"]
    for rel, content in texts.items():
        assert out[rel] == pytest.approx(ev.text_perplexity(model, tokenizer, content, 16))
    assert out["sft"] == pytest.approx(ev.sft_completion_loss(model, tokenizer, SFT_EXAMPLES, 16))
    assert capsys.readouterr().out == ""

    by_name = ev.evaluate_files(model, tokenizer, {"x": TEXT}, 16)
    assert list(by_name) == ["x"] and by_name["x"]["perplexity"] == out["a/val.txt"]["perplexity"]


def test_names_for_paths():
    assert ev._names_for_paths(["/d/x.txt", "/e/y.txt"], set()) == ["x.txt", "y.txt"]
    assert ev._names_for_paths(["/r/a/v.txt", "/r/b/v.txt"], set()) == ["a/v.txt", "b/v.txt"]
    assert ev._names_for_paths(["/r/v.txt", "/r/v.txt"], set()) == ["v.txt", "v.txt#2"]
    assert ev._names_for_paths(["/r/sft"], {"sft"}) == ["r/sft"]


def test_evaluate_files_errors(model, tokenizer, tmp_path):
    with pytest.raises(UsageError, match="not found"):
        ev.evaluate_files(model, tokenizer, [str(tmp_path / "missing.txt")], 16, progress=False)
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\xfa")
    with pytest.raises(DataError, match="UTF-8"):
        ev.evaluate_files(model, tokenizer, [str(tmp_path / "bad.txt")], 16, progress=False)
    (tmp_path / "tiny.txt").write_text("Q", encoding="utf-8")
    with pytest.raises(DataError, match="tiny.txt"):
        ev.evaluate_files(model, tokenizer, [str(tmp_path / "tiny.txt")], 16, progress=False)
    with pytest.raises(UsageError):
        ev.evaluate_files(model, tokenizer, {"sft": TEXT}, 16, sft_examples=SFT_EXAMPLES, progress=False)


def test_forgetting_report_math():
    before = {"a": {"perplexity": 10.0, "tokens": 5}, "b": 20.0, "sft": {"loss": 1.0}, "only_before": 3.0}
    after = {"a": {"perplexity": 12.5}, "b": 15.0, "sft": {"loss": 1.5}, "only_after": 4.0}
    rep = ev.forgetting_report(before, after)
    assert list(rep) == ["a", "b", "sft"]
    assert rep["a"] == {"before": 10.0, "after": 12.5, "change_pct": pytest.approx(25.0)}
    assert rep["b"]["change_pct"] == pytest.approx(-25.0)
    assert rep["sft"]["before"] == pytest.approx(math.e)
    assert rep["sft"]["change_pct"] == pytest.approx(100 * (math.exp(0.5) - 1))
    assert ev.forgetting_report({"z": math.inf}, {"z": 2.0})["z"]["change_pct"] is None


# ---------------------------------------------------------------------------------------------- loading


def test_load_for_eval(model, tokenizer, tmp_path):
    d = tmp_path / "ckpt"
    model.save_pretrained(d)
    tokenizer.save_pretrained(d)
    m2, t2 = ev.load_for_eval(str(d), device="cpu")
    assert not m2.training and m2.dtype == torch.float32
    want = ev.text_perplexity(model, tokenizer, TEXT, 16)["perplexity"]
    assert ev.text_perplexity(m2, t2, TEXT, 16)["perplexity"] == pytest.approx(want, rel=1e-5)
    m3, _ = ev.load_for_eval(str(d), device="cpu", dtype="bfloat16")
    assert m3.dtype == torch.bfloat16

    with pytest.raises(UsageError, match="not found"):
        ev.load_for_eval(str(tmp_path / "nope"))
    with pytest.raises(UsageError, match="not found"):
        ev.load_for_eval("./nope/at/all")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="config.json"):
        ev.load_for_eval(str(tmp_path / "empty"))
    no_weights = tmp_path / "noweights"
    model.config.save_pretrained(no_weights)
    tokenizer.save_pretrained(no_weights)
    with pytest.raises(UsageError, match="no weights") as info:  # the same check as training's --model
        ev.load_for_eval(str(no_weights), device="cpu")
    assert "\n" not in str(info.value)
    with pytest.raises(UsageError, match="dtype"):
        ev.load_for_eval(str(d), device="cpu", dtype="float99")


def test_progress_bar_goes_to_stderr_only(model, tokenizer, monkeypatch, capsys):
    import io

    class FakeTTY(io.StringIO):
        def isatty(self):
            return True

    fake = FakeTTY()
    monkeypatch.setattr(sys, "stderr", fake)
    out = ev.evaluate_files(model, tokenizer, {"t": TEXT}, 8, sft_examples=SFT_EXAMPLES, progress=True)
    assert out["t"]["windows"] == math.ceil(len(_ids(tokenizer, TEXT)) / 8)
    assert capsys.readouterr().out == ""
    assert fake.getvalue()  # the bar was drawn on (fake) stderr


def test_chunked_float32_conversion_is_exact(model, tokenizer, monkeypatch):
    """Logits are upcast in chunks of positions (memory bound); chunking must not change results."""
    whole = ev.text_perplexity(model, tokenizer, TEXT, 20)
    sft_whole = ev.sft_completion_loss(model, tokenizer, SFT_EXAMPLES, 64, batch_size=3)
    monkeypatch.setattr(ev.scoring, "_NLL_CHUNK", 3)
    assert ev.text_perplexity(model, tokenizer, TEXT, 20) == pytest.approx(whole, rel=1e-6)
    assert ev.sft_completion_loss(model, tokenizer, SFT_EXAMPLES, 64, batch_size=3) == pytest.approx(
        sft_whole, rel=1e-6
    )


def test_a_big_vocabulary_scores_a_few_windows_per_forward_with_the_same_results(model, tokenizer, monkeypatch):
    """rows_per_forward: the windows of a batch whose float32 logits would pass LOGITS_BYTES go through the model a
    few at a time; the perplexity and the KL to a reference do not change (the scoring is per window)."""
    from posttrainllm.evaluate import scoring

    vocab = model.get_output_embeddings().weight.shape[0]
    assert scoring.rows_per_forward(model, 20, 8) == 8  # a small vocabulary: the whole batch at once
    reference = _make_model(len(tokenizer), seed=1)
    whole = ev.evaluate_files(model, tokenizer, {"t": TEXT}, 12, batch_size=8, progress=False, reference=reference)
    monkeypatch.setattr(scoring, "LOGITS_BYTES", 4 * vocab * 12 * 3)  # 3 windows of 12 tokens per forward
    assert scoring.rows_per_forward(model, 12, 8) == 3 and scoring.rows_per_forward(model, 12, 2) == 2
    calls = []
    monkeypatch.setattr(model, "forward", _counting(model.forward, calls))
    split = ev.evaluate_files(model, tokenizer, {"t": TEXT}, 12, batch_size=8, progress=False, reference=reference)
    assert max(calls) <= 3 and len(calls) > 1
    assert split["t"]["perplexity"] == pytest.approx(whole["t"]["perplexity"], rel=1e-6)
    assert split["t"]["kl"] == pytest.approx(whole["t"]["kl"], rel=1e-6)
    assert split["t"]["predicted_tokens"] == whole["t"]["predicted_tokens"]
    monkeypatch.setattr(scoring, "LOGITS_BYTES", 1)
    assert scoring.rows_per_forward(model, 12, 8) == 1  # never fewer than one window


def _counting(forward, calls):
    def wrapped(*args, input_ids=None, **kwargs):
        calls.append(int(input_ids.shape[0]))
        return forward(*args, input_ids=input_ids, **kwargs)

    return wrapped
