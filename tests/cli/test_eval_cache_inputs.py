"""--eval-cache never writes into an input: a cache folder inside --model, --base or a data set's folder, or one that
is a file, is refused in one line before a model loads; a run with a cache leaves every input as it was."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from harness import run_args
from typer.testing import CliRunner

from posttrainllm.cli import app


def invoke(argv):
    return CliRunner().invoke(app, [str(a) for a in argv])


def digests(*roots: Path) -> dict[str, str]:
    out = {}
    for root in roots:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for f in files:
            out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


@pytest.fixture
def model(tiny_model_dir, tmp_path):
    d = tmp_path / "model"
    shutil.copytree(tiny_model_dir, d)
    return d


@pytest.mark.parametrize("where", ["model", "model_itself", "dataset_folder"])
def test_an_eval_cache_inside_an_input_is_exit_2_before_loading(model, alpaca_file, text_file, tmp_path, where):
    data, cache = alpaca_file, model / "cache" if where == "model" else model
    if where == "dataset_folder":  # a data set given as a folder
        data = tmp_path / "data"
        data.mkdir()
        shutil.copy(alpaca_file, data / "train.json")
        cache = data / "c"
    argv = run_args("sft", model, data, tmp_path / "o", "--ood-eval", text_file, "--eval-cache", cache)
    before = digests(model)
    r = invoke(argv)
    assert r.exit_code == 2, r.output
    assert "--eval-cache" in r.output and "inside" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o").exists() and digests(model) == before and (cache == model or not cache.exists())


def test_merge_refuses_an_eval_cache_inside_the_base(model, tmp_path, text_file):
    args = ["merge", "--base", model, "--model", model, "--alpha", "0.5", "--output-dir", tmp_path / "m"]
    r = invoke([*args, "--ood-eval", text_file, "--eval-cache", model / "c"])
    assert r.exit_code == 2 and "--eval-cache" in r.output and "--base" in r.output, r.output
    assert not (model / "c").exists() and not (tmp_path / "m").exists()


def test_an_eval_cache_that_is_a_file_is_exit_2(model, alpaca_file, text_file, tmp_path):
    f = tmp_path / "cache"
    f.write_text("x")
    r = invoke(run_args("sft", model, alpaca_file, tmp_path / "o", "--ood-eval", text_file, "--eval-cache", f))
    assert r.exit_code == 2 and "is not a folder" in r.output, r.output


@pytest.mark.smoke
def test_a_cached_run_leaves_every_input_as_it_was(model, alpaca_file, text_file, tmp_path):
    before = digests(model, alpaca_file, text_file)
    for out in ("o1", "o2"):  # the second run reads the cache the first wrote
        r = invoke(run_args("sft", model, alpaca_file, tmp_path / out, "--ood-eval", text_file, "--eval-cache",
            tmp_path / "cache", max_length=128))  # fmt: skip
        assert r.exit_code == 0, r.output
    assert digests(model, alpaca_file, text_file) == before
    entries = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    assert len(entries) == 1  # the base's identity did not change between the runs: one entry, reused
