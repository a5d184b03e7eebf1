"""LR factors beyond depth: --lr-group PATTERN=FACTOR and LoRA+ (--loraplus-ratio), composed with layer decay:
lr = base × depth_scale × pattern_factor × loraplus_factor, for every parameter, under LoRA, tied embeddings,
clamp and freeze; errors for overlapping and unmatched patterns; the CLI/recipe forms; resume refuses a change."""

import json
import math
import re

import pytest
import torch
from harness import cli_args
from typer.testing import CliRunner

from posttrainllm.cli import app
from posttrainllm.constants import DEFAULT_TIED_POLICY
from posttrainllm.llrd import apply_freeze, build_param_groups

runner = CliRunner()
BASE, GAMMA, N = 1e-3, 0.8, 4
BLOCK = re.compile(r"layers\.(\d+)\.")


def llama(tie=False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=N,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=32,
            tie_word_embeddings=tie,
        )
    )


def lora(model, **kw):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj", "up_proj"], **kw))


def depth_scale(name, tied_name=None, tied_policy="head", min_scale=0.0):
    """Independent of the library: block index from the name, embeddings = block 0, everything else head."""
    plain = name.replace("base_model.model.", "")
    if name == tied_name:
        raw = GAMMA ** (N - 1) if tied_policy == "embedding" else 1.0
    elif m := BLOCK.search(plain):
        raw = GAMMA ** (N - 1 - int(m.group(1)))
    elif plain.startswith("model.embed_tokens."):
        raw = GAMMA ** (N - 1)
    else:
        raw = 1.0
    return max(raw, min_scale)


def pattern_factor(name, lr_groups):
    plain = name.replace("base_model.model.", "")
    hits = [f for p, f in lr_groups.items() if re.search(p, plain)]
    assert len(hits) <= 1
    return hits[0] if hits else 1.0


def lrs(plan):
    return {n: g["lr"] for g in plan.groups for n in plan.param_names[g["name"]]}


CASES = {
    "full": dict(model=lambda: llama(), kw={}),
    "tied_head": dict(model=lambda: llama(tie=True), kw={"tied_policy": "head"}),
    "tied_default": dict(model=lambda: llama(tie=True), kw={}),
    "tied_embedding": dict(model=lambda: llama(tie=True), kw={"tied_policy": "embedding"}),
    "clamp": dict(model=lambda: llama(), kw={"min_scale": 0.7}),
    "freeze": dict(model=lambda: llama(), kw={"freeze_below": 0.6}),
    "lora": dict(model=lambda: lora(llama()), kw={"loraplus_ratio": 16.0}),
    "lora_clamp_tied": dict(
        model=lambda: lora(llama(tie=True), modules_to_save=["lm_head"]), kw={"loraplus_ratio": 4.0, "min_scale": 0.6}
    ),
}
LR_GROUPS = {"mlp": 0.5, r"self_attn\.(q|k)_proj": 2.0, "embed_tokens|norm": 0.25}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_lr_is_base_times_depth_scale_times_pattern_times_loraplus(case):
    model = CASES[case]["model"]()
    kw = CASES[case]["kw"]
    plan = build_param_groups(model, BASE, GAMMA, 0.1, lr_groups=LR_GROUPS, **kw)
    ratio = kw.get("loraplus_ratio", 1.0)
    frozen = set(plan.frozen_param_names)
    got = lrs(plan)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert sorted(list(got) + list(frozen)) == sorted(trainable)  # each trainable parameter once: a group or frozen
    for name in trainable:
        policy = kw.get("tied_policy", DEFAULT_TIED_POLICY)
        ds = depth_scale(name, plan.tied_param_name, policy, kw.get("min_scale", 0.0))
        if ds < kw.get("freeze_below", 0.0):
            assert name in frozen, name
            continue
        plus = ratio if re.search(r"lora_B", name) else 1.0
        want = BASE * ds * pattern_factor(name, LR_GROUPS) * plus
        assert math.isclose(got[name], want, rel_tol=1e-12), (name, got[name], want)
    for g in plan.groups:
        assert math.isclose(g["lr"], BASE * g["depth_scale"] * g["factor"] * g["loraplus"], rel_tol=1e-12)
        assert g["params"]  # no empty group
    # bounded: depths × factor combinations × decay
    combos = len(LR_GROUPS) + 1
    assert len(plan.groups) <= (N + 2) * combos * (2 if ratio == 1.0 else 4)


def test_a_parameter_matched_by_two_patterns_is_an_error_naming_both():
    with pytest.raises(ValueError, match=r"matches LR group patterns 'mlp' and 'up_proj'"):
        build_param_groups(llama(), BASE, GAMMA, lr_groups={"mlp": 0.5, "up_proj": 2.0})


def test_a_pattern_matching_nothing_is_an_error_listing_parameter_names():
    with pytest.raises(ValueError, match=r"'cross_attn' matches no parameter; parameter names look like: model\.embed"):
        build_param_groups(llama(), BASE, GAMMA, lr_groups={"cross_attn": 0.5})


@pytest.mark.parametrize("bad", [{"mlp": -1.0}, {"mlp": float("nan")}, {"mlp": float("inf")}, {"(": 1.0}])
def test_bad_factors_and_patterns_are_value_errors(bad):
    with pytest.raises(ValueError):
        build_param_groups(llama(), BASE, GAMMA, lr_groups=bad)


def test_factor_zero_freezes_the_matched_parameters():
    model = llama()
    plan = build_param_groups(model, BASE, GAMMA, lr_groups={"embed_tokens": 0.0})
    assert plan.frozen_param_names == ["model.embed_tokens.weight"] and plan.lr_scaled
    assert apply_freeze(plan) == 1 and not model.model.embed_tokens.weight.requires_grad
    row = next(r for r in plan.rows if r["block"] == "embeddings")
    assert row["factors"] == ["embed_tokens×0 (frozen)"] and not row["trainable"]


def test_loraplus_without_lora_adapters_is_an_error():
    with pytest.raises(ValueError, match="no trainable lora_B"):
        build_param_groups(llama(), BASE, GAMMA, loraplus_ratio=16)


def test_flat_plan_with_a_factor_still_has_base_lr_elsewhere():
    plan = build_param_groups(llama(), BASE, 1.0, lr_groups={"mlp": 0.5})
    assert {g["name"] for g in plan.groups} == {"all", "all+mlp"}
    assert plan.lr_of("model.layers.0.mlp.up_proj.weight") == BASE * 0.5
    assert plan.lr_of("model.layers.0.self_attn.q_proj.weight") == BASE


# ---------------------------------------------------------------------------------------------------------- CLI
def _dry(model_dir, data, out, *extra):
    return runner.invoke(
        app,
        cli_args("sft", model_dir, data, out, *extra, dry_run=True, max_length=128, lr="1e-3"),
    )


def test_cli_lr_groups_and_loraplus_reach_param_groups_json_and_the_banner(tiny_model_dir, alpaca_file, tmp_path):
    r = _dry(
        tiny_model_dir,
        alpaca_file,
        tmp_path / "o",
        "--llrd",
        "0.5",
        "--lr-group",
        "mlp=0.5",
        "--lr-group",
        r"self_attn\.(q|k)_proj=2",
        "--lora-r",
        "2",
        "--loraplus-ratio",
        "16",
    )
    assert r.exit_code == 0, r.output
    assert "LR factors: mlp×0.5, self_attn\\.(q|k)_proj×2, LoRA+ B×16" in r.output
    assert "× factors" in r.output
    groups = json.loads((tmp_path / "o" / "param_groups.json").read_text())
    for g in groups:
        for name in g["params"]:
            i = int(BLOCK.search(name).group(1))
            f = 0.5 if ".mlp." in name else 2.0 if re.search(r"self_attn\.(q|k)_proj", name) else 1.0
            plus = 16.0 if "lora_B" in name else 1.0
            assert g["lr"] == pytest.approx(1e-3 * 0.5 ** (3 - i) * f * plus, rel=1e-12), name
            assert (g["depth_scale"], g["factor"], g["loraplus"]) == pytest.approx((0.5 ** (3 - i), f, plus))


def test_recipe_lr_groups_mapping_and_cli_override(tiny_model_dir, alpaca_file, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("llrd: 0.8\nlr_groups:\n  mlp: 0.5\n  'embed_tokens': 0.1\n")
    r = _dry(tiny_model_dir, alpaca_file, tmp_path / "o", "--recipe", str(recipe))
    assert r.exit_code == 0, r.output
    groups = {g["name"]: g for g in json.loads((tmp_path / "o" / "param_groups.json").read_text())}
    assert groups["embeddings+embed_tokens"]["lr"] == pytest.approx(1e-3 * 0.8**3 * 0.1)
    r = _dry(tiny_model_dir, alpaca_file, tmp_path / "o2", "--recipe", str(recipe), "--lr-group", "lm_head=3")
    assert r.exit_code == 0, r.output
    groups = {g["name"]: g for g in json.loads((tmp_path / "o2" / "param_groups.json").read_text())}
    assert "head+lm_head" in groups and not any("mlp" in n for n in groups)  # the CLI list replaces the recipe's


@pytest.mark.parametrize(
    "args,fragment,code",
    [
        (["--lr-group", "mlp"], "PATTERN=FACTOR", 2),
        (["--lr-group", "mlp=fast"], "PATTERN=FACTOR", 2),
        (["--lr-group", "mlp=-1"], "must be a finite number >= 0", 2),
        (["--lr-group", "(=1"], "not a valid regular expression", 2),
        (["--loraplus-ratio", "16"], "--loraplus-ratio needs --lora-r", 2),
        (["--lr-group", "mlp=0.5", "--lr-group", "up_proj=2"], "matches LR group patterns 'mlp' and 'up_proj'", 2),
        (["--lr-group", "cross_attn=2"], "matches no parameter", 2),
    ],
)
def test_cli_errors(args, fragment, code, tiny_model_dir, alpaca_file, tmp_path):
    r = _dry(tiny_model_dir, alpaca_file, tmp_path / "o", "--llrd", "0.8", *args)
    assert r.exit_code == code, r.output
    assert fragment in r.output and "Traceback" not in r.output


def test_resume_with_changed_lr_groups_is_refused(tmp_path):
    out = tmp_path / "o"
    (out / "checkpoint-2").mkdir(parents=True)
    (out / "checkpoint-2" / "COMPLETE").write_text("{}")
    (out / "run_config.json").write_text(
        json.dumps({"command": "sft", "model": "org/m", "lr": 2e-5, "llrd": 1.0, "lr_groups": {"mlp": 0.5}})
    )
    r = runner.invoke(
        app,
        cli_args("sft", "org/m", "org/d", out, resume=True, lr_group="mlp=0.25"),
    )
    assert r.exit_code == 2 and "lr_groups" in r.output and "--allow-config-change" in r.output
