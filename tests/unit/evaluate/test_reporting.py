"""What the run prints: hints with brackets print as written, and the per-block table says where a tied matrix
trains."""

from __future__ import annotations

import io
import sys
from types import SimpleNamespace

import pytest
from rich.console import Console

from posttrainllm.reporting import banner


def _printed(fn) -> str:
    with banner.console.capture() as cap:
        fn()
    return cap.get()


def test_the_missing_matplotlib_hint_keeps_its_brackets(monkeypatch, tmp_path):
    """drift.png cannot be drawn without matplotlib: the note must print `pip install 'posttrainllm[plot]'` (Rich
    markup once read `[plot]` as a style tag and dropped it)."""
    from posttrainllm.reporting import records

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    report = {"depths": [{"block": "embeddings", "drift": 0.01}, {"block": "head", "drift": 0.05}]}
    out = _printed(lambda: records.write_drift(SimpleNamespace(own=lambda names: None), tmp_path, report))
    assert "pip install 'posttrainllm[plot]'" in out, out


@pytest.mark.parametrize("text", ["[bold]not bold[/bold]", "see [/path/pair.cc:553]", "a[b] [c]"])
def test_every_printed_string_is_text_not_markup(text):
    assert text in _printed(lambda: banner.console.print(f"value: {text}"))
    assert f"note: {text}" in _printed(lambda: banner.note(text))
    table = _printed(lambda: banner.console.print(banner.styled(("x", "bold"), " ", text)))
    assert text in table


def _tied_plan(policy):
    from transformers import LlamaConfig, LlamaForCausalLM

    from posttrainllm import build_param_groups

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    return build_param_groups(LlamaForCausalLM(cfg), 1e-3, 0.8, tied_policy=policy)


def _table(plan) -> dict[str, str]:
    console = Console(file=io.StringIO(), width=200, markup=False)
    console.print(banner.block_table(plan))
    lines = console.file.getvalue().splitlines()
    return {line.split()[0]: line for line in lines if line.strip() and line.split()[0] in ("embeddings", "head")}


def test_the_banner_says_where_a_tied_embedding_matrix_trains():
    rows = _table(_tied_plan("head"))
    assert "not trainable" not in rows["embeddings"]
    assert "tied to the head: trains at the head's LR" in rows["embeddings"]
    rows = _table(_tied_plan("embedding"))  # the head keeps its final norm: a trainable row of its own
    assert "(tied)" in rows["embeddings"] and "not trainable" not in rows["head"]
