"""--llrd-bottom-scale S: layer decay given by block 0's LR scale, γ = S^(1/(N-1)) for the model's N blocks, so one
setting carries across depths. Closed forms from param_groups.json; errors before the model loads."""

import json

import pytest
from harness import cli_args
from typer.testing import CliRunner

from posttrainllm.cli import app
from posttrainllm.llrd import gamma_for_bottom_scale

runner = CliRunner()


@pytest.mark.parametrize(("s", "n", "gamma"), [(0.25, 3, 0.5), (0.512, 4, 0.8), (1.0, 24, 1.0), (0.3, 1, 1.0)])
def test_gamma_for_bottom_scale_closed_form(s, n, gamma):
    assert gamma_for_bottom_scale(s, n) == pytest.approx(gamma, rel=1e-12)


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5])
def test_gamma_for_bottom_scale_rejects_a_scale_outside_0_1(bad):
    with pytest.raises(ValueError, match="bottom scale"):
        gamma_for_bottom_scale(bad, 4)


def _model(tmp_path, n_layers):
    import torch
    from conftest import build_tiny_model, build_tokenizer

    torch.manual_seed(0)
    tok = build_tokenizer()
    d = tmp_path / f"m{n_layers}"
    build_tiny_model(tok, n_layers=n_layers).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _dry_run(model, data, out, *extra):
    return runner.invoke(
        app,
        cli_args("sft", model, data, out, *extra, dry_run=True, lr="1e-3"),
    )


@pytest.mark.parametrize("n_layers", [4, 8])
def test_block_0_trains_at_the_bottom_scale_whatever_the_depth(n_layers, tmp_path, alpaca_file):
    model = _model(tmp_path, n_layers)
    r = _dry_run(model, alpaca_file, tmp_path / "out", "--llrd-bottom-scale", "0.2")
    assert r.exit_code == 0, r.output
    gamma = 0.2 ** (1 / (n_layers - 1))
    groups = {g["name"]: g for g in json.loads((tmp_path / "out" / "param_groups.json").read_text())}
    for i in range(n_layers):
        assert groups[f"block_{i}"]["lr"] == pytest.approx(1e-3 * gamma ** (n_layers - 1 - i), rel=1e-9)
    assert groups["block_0"]["lr"] == pytest.approx(2e-4, rel=1e-9)
    assert groups["embeddings"]["lr"] == pytest.approx(2e-4, rel=1e-9)
    assert groups["head"]["lr"] == pytest.approx(1e-3, rel=1e-12)
    assert f"γ = 0.2^(1/{n_layers - 1}) = {gamma:.4f}" in r.output
    config = json.loads((tmp_path / "out" / "run_config.json").read_text())
    assert config["llrd_bottom_scale"] == 0.2 and config["llrd_gamma_from_bottom_scale"] == pytest.approx(gamma)


def test_the_recipe_key_works(tmp_path, alpaca_file):
    model = _model(tmp_path, 4)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("llrd_bottom_scale: 0.512\n")
    r = _dry_run(model, alpaca_file, tmp_path / "out", "--recipe", str(recipe))
    assert r.exit_code == 0, r.output
    assert "LR layer-decay: γ=0.8 → block_0 LR=5.12e-04" in r.output


def test_a_bottom_scale_that_needs_gamma_below_half_is_exit_2_before_the_model_loads(
    tmp_path, alpaca_file, monkeypatch
):
    from posttrainllm import models

    model = _model(tmp_path, 4)

    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load_model", no_load)
    r = _dry_run(model, alpaca_file, tmp_path / "out", "--llrd-bottom-scale", "0.1")
    assert r.exit_code == 2, r.output
    assert "--llrd-bottom-scale 0.1 on a 4-block model" in r.output and "at least 0.125" in r.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--llrd-bottom-scale", "0.5", "--llrd", "0.9"], "--llrd and --llrd-bottom-scale"),
        (["--llrd-bottom-scale", "0"], "must be in (0, 1]"),
        (["--llrd-bottom-scale", "nan"], "--llrd-bottom-scale"),
    ],
)
def test_bad_bottom_scales_are_usage_errors(args, message, tmp_path, alpaca_file):
    r = _dry_run(tmp_path / "no-model", alpaca_file, tmp_path / "out", *args)
    assert r.exit_code == 2 and message in r.output, r.output
