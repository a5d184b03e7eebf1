"""The per-depth drift report: ‖W_after − W_before‖ / ‖W_before‖ per depth, from the base safetensors (no second
copy of the model), LoRA as the merged update; checked against the saved weights independently."""

import re

import pytest
import torch
from safetensors.torch import load_file

from posttrainllm.llrd import build_param_groups
from posttrainllm.reporting import drift


def _train(model, groups, steps=4, seed=0):
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(groups)
    for _ in range(steps):
        ids = torch.randint(0, 50, (2, 16))
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad()


def _load(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir)


def independent_drift(model_dir, trained_state, n_blocks):
    """Per depth from two state dicts, written without posttrainllm: block index from the name."""
    base = load_file(str(model_dir / "model.safetensors"))
    num, den = {}, {}
    for key, before in base.items():
        m = re.search(r"layers\.(\d+)\.", key)
        depth = f"block_{m.group(1)}" if m else "embeddings" if "embed_tokens" in key else "head"
        after = trained_state[key].float()
        num[depth] = num.get(depth, 0.0) + float(((after - before.float()) ** 2).sum())
        den[depth] = den.get(depth, 0.0) + float((before.float() ** 2).sum())
    return {d: (num[d] / den[d]) ** 0.5 for d in num}


@pytest.mark.parametrize("gamma", [0.5, 1.0])
def test_full_finetune_drift_matches_the_saved_weights_and_follows_gamma(gamma, tiny_model_dir):
    model = _load(tiny_model_dir)
    plan = build_param_groups(model, 1e-3, gamma)
    baseline = drift.Baseline(model, str(tiny_model_dir))
    assert not baseline.copies  # everything is read from the safetensors file
    _train(model, plan.groups)
    report = drift.measure(model, baseline, plan)
    got = {r["block"]: r["drift"] for r in report["depths"]}
    want = independent_drift(tiny_model_dir, model.state_dict(), 4)
    assert got == pytest.approx(want, rel=1e-5)
    ratio = got["block_0"] / got["block_3"]
    if gamma == 0.5:
        assert ratio < 0.3  # block_0 trains at γ³ = 1/8 of the top block's LR
    else:
        assert 0.5 < ratio < 2.0  # same order
    assert "block_0" in drift.bar_chart(report) and "█" in drift.bar_chart(report)


def test_tied_embeddings_count_once_at_the_head_and_no_empty_depth_is_reported(tmp_path):
    from conftest import build_tiny_model, build_tokenizer

    torch.manual_seed(0)
    tok = build_tokenizer()
    model = build_tiny_model(tok, tie_word_embeddings=True)
    model.save_pretrained(tmp_path)
    model = _load(tmp_path)
    plan = build_param_groups(model, 1e-3, 0.5, tied_policy="head")  # the shared matrix trains at the head's LR
    baseline = drift.Baseline(model, str(tmp_path))
    _train(model, plan.groups)
    report = drift.measure(model, baseline, plan)
    got = {r["block"]: r["drift"] for r in report["depths"]}
    assert list(got) == ["block_0", "block_1", "block_2", "block_3", "head"]  # no "embeddings" row of 0
    state = model.state_dict()
    base = load_file(str(tmp_path / "model.safetensors"))
    head_keys = [k for k in base if "layers." not in k]  # the shared embedding matrix (saved once) and the norm
    num = sum(float(((state[k].float() - base[k].float()) ** 2).sum()) for k in head_keys)
    den = sum(float((base[k].float() ** 2).sum()) for k in head_keys)
    assert got["head"] == pytest.approx((num / den) ** 0.5, rel=1e-5)
    assert "embeddings" not in drift.bar_chart(report)


def test_lora_drift_is_the_merged_update_relative_to_the_base_weight(tiny_model_dir):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        _load(tiny_model_dir),
        LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    plan = build_param_groups(model, 1e-3, 0.5)
    baseline = drift.Baseline(model, str(tiny_model_dir))
    _train(model, plan.groups)
    report = drift.measure(model, baseline, plan)
    got = {r["block"]: r["drift"] for r in report["depths"]}
    merged = model.merge_and_unload()
    want = independent_drift(tiny_model_dir, merged.state_dict(), 4)
    assert got == pytest.approx(want, rel=1e-4)
    assert got["embeddings"] == 0.0 and got["head"] == 0.0 and got["block_2"] > 0


def test_tensors_not_on_disk_as_in_the_model_are_copied_before_training(tiny_model_dir, tmp_path):
    model = _load(tiny_model_dir)
    model.resize_token_embeddings(model.config.vocab_size + 8)  # embeddings no longer match the file's shape
    baseline = drift.Baseline(model, str(tiny_model_dir))
    assert set(baseline.copies) == {"model.embed_tokens.weight", "lm_head.weight"}
    assert "CPU copy" in baseline.source
    nothing = drift.Baseline(model, None)  # no files at all: every trainable tensor is copied
    assert len(nothing.copies) == sum(1 for p in model.parameters() if p.requires_grad)


def test_plot_writes_a_png_or_says_why_not(tmp_path):
    report = {
        "depths": [
            {"block": "embeddings", "drift": 0.01},
            {"block": "block_0", "drift": 0.02},
            {"block": "head", "drift": 0.05},
        ]
    }
    note = drift.plot(report, tmp_path / "drift.png")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert note and "matplotlib" in note
    else:
        assert note is None and (tmp_path / "drift.png").stat().st_size > 1000
