"""A config that disagrees with its weights: checked from the safetensors headers before anything is built (an
absurd block count exits 2 in seconds), missing or unused weights of a model being fine-tuned exit 1 unless
--allow-new-weights, and a plan that freezes everything says "nothing left to train" (exit 2)."""

import json
import shutil
import time

import pytest
from conftest import build_tiny_model, build_tokenizer
from harness import cli_args
from typer.testing import CliRunner

from posttrainllm.cli import app
from posttrainllm.errors import ModelError, UsageError

runner = CliRunner()


def _copy_with(src, dst, **config):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(config)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _sft(model, data, out, *extra):
    args = cli_args("sft", model, data, out, *extra, dry_run=True)
    return runner.invoke(app, args)


def _no_load(monkeypatch):
    from posttrainllm import models

    def refuse(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load_model", refuse)


def test_stored_tensors_reads_names_and_shapes_from_the_header(tiny_model_dir):
    from posttrainllm.models import weights

    tensors = weights.stored_tensors(tiny_model_dir)
    assert tensors["model.layers.3.mlp.up_proj.weight"] == (64, 32)
    assert weights.stored_blocks(tensors)["model.layers"][0] == 4


def test_no_safetensors_means_no_check(tmp_path):
    from posttrainllm.models import weights

    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2_000_000}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    assert weights.check_config(tmp_path) is None
    assert weights.check_config("some-org/some-hub-model") is None


def test_two_million_blocks_over_four_exit_2_in_seconds(tiny_model_dir, alpaca_file, tmp_path, monkeypatch):
    bad = _copy_with(tiny_model_dir, tmp_path / "bad", num_hidden_layers=2_000_000)
    _no_load(monkeypatch)
    for extra in ((), ("--allow-new-weights",)):  # even the opt-in does not allow this
        start = time.monotonic()
        r = _sft(bad, alpaca_file, tmp_path / "out", *extra)
        assert r.exit_code == 2, r.output
        assert time.monotonic() - start < 30
        text = " ".join(r.output.split())
        assert "num_hidden_layers: 2000000" in text and "hold 4 blocks" in text
        assert "set num_hidden_layers to 4 in config.json" in text


def test_six_blocks_over_four_exit_2_unless_allowed(tiny_model_dir, alpaca_file, tmp_path, monkeypatch):
    bad = _copy_with(tiny_model_dir, tmp_path / "six", num_hidden_layers=6)
    with monkeypatch.context() as m:
        _no_load(m)
        r = _sft(bad, alpaca_file, tmp_path / "out")
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert "num_hidden_layers: 6" in text and "hold 4 blocks" in text and "--allow-new-weights" in text
    r = _sft(bad, alpaca_file, tmp_path / "out2", "--allow-new-weights")
    assert r.exit_code == 0, r.output
    assert "not in the checkpoint (random init: model.layers.4." in " ".join(r.output.split())


@pytest.fixture
def lacking_norm(tmp_path):
    """A tiny model directory whose safetensors lacks model.norm.weight (the block count still matches)."""
    from safetensors.torch import save_file

    tok = build_tokenizer()
    model = build_tiny_model(tok)
    d = tmp_path / "lacking"
    model.save_pretrained(d)
    tok.save_pretrained(d)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "model.norm.weight"}
    save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


def test_missing_weights_of_a_model_to_fine_tune_are_a_model_error(lacking_norm):
    from posttrainllm import models

    with pytest.raises(ModelError, match=r"1 weights of the model are not in the checkpoint.*model\.norm\.weight"):
        models.load_model(str(lacking_norm), fine_tune=True)
    notes = []
    models.load_model(str(lacking_norm), fine_tune=True, allow_new_weights=True, notes=notes)
    assert notes and "model.norm.weight" in notes[0]
    models.load_model(str(lacking_norm))  # eval / generate: not a fine-tune, loads as before


def test_unused_weights_are_named_and_tied_heads_are_not_flagged(tiny_model_dir, tmp_path):
    from posttrainllm import models
    from posttrainllm.models import weights

    info = {"missing_keys": set(), "unexpected_keys": {"model.extra.weight"}, "mismatched_keys": set()}
    with pytest.raises(ModelError, match=r"not in the model \(dropped: model\.extra\.weight\)"):
        weights.check_loaded("m", info, allow_new_weights=False)
    tok = build_tokenizer()
    tied = build_tiny_model(tok, tie_word_embeddings=True)
    tied.save_pretrained(tmp_path / "tied")
    models.load_model(str(tmp_path / "tied"), fine_tune=True)  # lm_head shares the embeddings: not missing


def test_lr_group_freezing_everything_exits_2_before_loading(tiny_model_dir, alpaca_file, tmp_path, monkeypatch):
    _no_load(monkeypatch)
    r = _sft(tiny_model_dir, alpaca_file, tmp_path / "out", "--lr-group", ".=0")
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert "--lr-group '.=0': nothing left to train" in text


def test_plan_builder_says_nothing_left_to_train(tiny_model_dir):
    from posttrainllm import llrd

    tok = build_tokenizer()
    model = build_tiny_model(tok)
    with pytest.raises(llrd.LLRDArgumentError, match="nothing left to train") as e:
        llrd.build_param_groups(model, 1e-3, 0.5, freeze_below=0.9, lr_groups={r"layers\.3\.|lm_head|model\.norm": 0.0})
    assert e.value.fields == ("lr_groups", "freeze_below")
    from types import SimpleNamespace

    from posttrainllm.planning import plan_param_groups

    cfg = SimpleNamespace(
        llrd=1.0, llrd_bottom_scale=0, lr=1e-3, weight_decay=0.0, tied_embeddings="head", llrd_min_scale=0.0,
        llrd_freeze_below=0.0, llrd_blocks=None, lr_groups={".": 0.0}, loraplus_ratio=None,
        vision_llrd=None, projector_lr_scale=None, freeze_vision=False, vision_blocks=None,
    )  # fmt: skip
    with pytest.raises(UsageError, match="^--lr-group: nothing left to train"):
        plan_param_groups(cfg, model)
