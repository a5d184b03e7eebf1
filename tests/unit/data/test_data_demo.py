"""posttrainllm.commands.demo_data: the demo's generated instruction set and standard-library corpus."""

from __future__ import annotations

import re

from posttrainllm import data as D
from posttrainllm.commands import demo_data

# ---------------------------------------------------------------------------------------------------------------
# Demo data
# ---------------------------------------------------------------------------------------------------------------


def test_instruction_set_deterministic_and_correct():
    a = demo_data.instruction_set(300, seed=3)
    assert a == demo_data.instruction_set(300, seed=3)
    assert a != demo_data.instruction_set(300, seed=4)
    assert len(a) == 300 and all(set(r) == {"instruction", "input", "output"} for r in a)
    checked = 0
    for r in a:
        ins, out = r["instruction"], r["output"]
        if m := re.fullmatch(r"Add (\d+) and (\d+)\.", ins):
            assert int(out) == int(m[1]) + int(m[2])
        elif m := re.fullmatch(r"What is (\d+) minus (\d+)\?", ins):
            assert int(out) == int(m[1]) - int(m[2])
        elif m := re.fullmatch(r"Multiply (\d+) by (\d+)\.", ins):
            assert int(out) == int(m[1]) * int(m[2])
        elif m := re.fullmatch(r"Reverse the word: (\w+)", ins):
            assert out == m[1][::-1]
        elif m := re.fullmatch(r"Uppercase: (.+)", ins):
            assert out == m[1].upper()
        elif m := re.fullmatch(r"Count the letters in: (\w+)", ins):
            assert int(out) == len(m[1])
        elif ins == "Sort these numbers in ascending order.":
            assert [int(x) for x in out.split(", ")] == sorted(int(x) for x in r["input"].split(", "))
        elif ins == "Which number is the largest?":
            assert int(out) == max(int(x) for x in r["input"].split(", "))
        else:
            continue
        checked += 1
    assert checked > 100
    assert any(r["instruction"].startswith("Add ") for r in a)
    kinds = {r["instruction"].split()[0] for r in a}
    assert len(kinds) >= 8


def test_stdlib_corpus_deterministic_and_disjoint():
    pre, held = demo_data.stdlib_corpus(max_chars=60_000, seed=0)
    assert (pre, held) == demo_data.stdlib_corpus(max_chars=60_000, seed=0)
    assert 0 < len(pre) <= 60_000 and 0 < len(held) <= 60_000 // 8
    header = re.compile(r"^# ==== Lib/(\S+) ====$", re.M)
    top = lambda p: p.split("/")[0].removesuffix(".py")  # noqa: E731
    pre_mods = {top(p) for p in header.findall(pre)}
    held_mods = {top(p) for p in header.findall(held)}
    assert pre_mods and held_mods and not pre_mods & held_mods
    assert not any(m in {"test", "idlelib", "tkinter"} for m in pre_mods | held_mods)
    assert demo_data.stdlib_corpus(max_chars=60_000, seed=1) != (pre, held)


def test_write_demo_files(tmp_path, tokenizer):
    paths = demo_data.write_demo_files(tmp_path / "demo")
    assert set(paths) == {"pretrain", "heldout_code", "instructions", "instructions_eval"}
    assert all(p.exists() and p.stat().st_size > 0 for p in paths.values())
    train = D.read_records(str(paths["instructions"]))
    evals = D.read_records(str(paths["instructions_eval"]))
    assert len(train) == 400 and len(evals) == 50
    assert not {r["instruction"] + r["input"] for r in train} & {r["instruction"] + r["input"] for r in evals}
    prep = D.prepare_sft(str(paths["instructions"]), tokenizer, eval_source=str(paths["instructions_eval"]))
    assert prep.format == "alpaca" and (prep.n_train, prep.n_eval) == (400, 50)
    assert D.detect_format(D.read_records(str(paths["pretrain"])), "text") == "text"
