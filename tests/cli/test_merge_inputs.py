"""posttrainllm merge refuses inputs that would give a broken or wrong result, in one line and with nothing left
behind: non-finite weights (in --base, --model or a LoRA adapter), an adapter trained on another base (depth,
shapes, the recorded base), --alpha values that collide once formatted and an empty --alpha; a killed merge's folder
says the merge's own fix; no input is ever modified."""

import hashlib
import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_merge import _check_closed_form, _merge, _pair


def _one_line_error(r):
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in r.output, r.output
    return " ".join(r.output.split())


def _poison(model_dir, name, value=math.nan):
    """Set one element of tensor `name` in the model's safetensors file to `value` (the rest unchanged)."""
    path = model_dir / "model.safetensors"
    state = load_file(path)
    state[name] = state[name].clone()
    state[name].view(-1)[3] = value
    save_file(state, path, metadata={"format": "pt"})


def _lora(base, out, *, seed=3, **kw):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    lora = LoraConfig(r=2, lora_alpha=4, init_lora_weights=False, **kw)
    get_peft_model(AutoModelForCausalLM.from_pretrained(base), lora).save_pretrained(out)
    return out


# --------------------------------------------------------------------------------------------- non-finite weights
@pytest.mark.parametrize("value", [math.nan, math.inf])
@pytest.mark.parametrize("side", ["--model", "--base"])
def test_non_finite_weights_are_refused_naming_the_file_and_tensor(tmp_path, side, value):
    base, tuned = _pair(tmp_path, "llama")
    name = "model.layers.1.mlp.up_proj.weight"
    bad = tuned if side == "--model" else base
    _poison(bad, name, value)
    out = tmp_path / "out"
    r = _merge(base, tuned, out, "--alpha", "0.5,0.75")
    assert r.exit_code == 2, r.output
    text = _one_line_error(r)
    assert side in text and name in text and str(bad / "model.safetensors") in text, text
    # nothing of the merge is left: no model a later step could take for a result
    assert not out.exists() or not [p for p in out.iterdir() if p.name != ".posttrainllm"], list(out.iterdir())


def test_a_lora_adapter_with_non_finite_weights_is_refused_naming_the_adapter_file(tmp_path):
    base, _ = _pair(tmp_path, "llama")
    adapter = _lora(base, tmp_path / "adapter", target_modules=["q_proj", "v_proj"])
    weights = adapter / "adapter_model.safetensors"
    state = load_file(weights)
    name = next(n for n in sorted(state) if "lora_B" in n)
    state[name] = torch.full_like(state[name], math.nan)
    save_file(state, weights, metadata={"format": "pt"})
    out = tmp_path / "out"
    r = _merge(base, adapter, out, "--alpha", "0.5")
    assert r.exit_code == 2, r.output
    text = _one_line_error(r)
    assert str(weights) in text and name in text, text
    assert not out.exists() or not [p for p in out.iterdir() if p.name != ".posttrainllm"]


def test_after_a_refused_merge_the_same_folder_takes_a_good_one(tmp_path):
    base, tuned = _pair(tmp_path, "llama")
    good = tuned.with_name("good")
    good.mkdir()
    for f in tuned.iterdir():
        (good / f.name).write_bytes(f.read_bytes())
    _poison(tuned, "model.norm.weight")
    out = tmp_path / "out"
    assert _merge(base, tuned, out, "--alpha", "0.5").exit_code == 2
    r = _merge(base, good, out, "--alpha", "0.5")
    assert r.exit_code == 0, r.output
    _check_closed_form(base, good, out, "uniform", 0.5)


# ------------------------------------------------------------------------------------ an adapter of another base
def test_an_adapter_of_a_deeper_model_is_refused_naming_both(tmp_path):
    """An adapter of a 3-block model into a 2-block base of the same family and tokenizer: peft would drop block
    2's weights without a word."""
    base3, _ = _pair(tmp_path, "llama")
    base2, _ = _pair(tmp_path, "llama", num_hidden_layers=2, seed=1)
    adapter = _lora(base3, tmp_path / "adapter", target_modules=["q_proj", "v_proj"])
    r = _merge(base2, adapter, tmp_path / "out", "--alpha", "0.5")
    assert r.exit_code == 2, r.output
    text = _one_line_error(r)
    assert str(adapter) in text and str(base2) in text and "3" in text and "2" in text, text
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (dict(num_hidden_layers=4), "model.layers.3."),  # deeper: block 3 would be dropped
        (dict(num_hidden_layers=2), "no weights for model.layers.2."),  # shallower: block 2 would stay the base's
        (dict(hidden_size=32, intermediate_size=64), "shape"),
    ],
    ids=["deeper", "shallower", "wider"],
)
def test_an_adapter_whose_recorded_base_is_gone_is_checked_by_its_tensors(tmp_path, change, words):
    import shutil

    other, _ = _pair(tmp_path, "llama", seed=1, **change)
    base, _ = _pair(tmp_path, "llama")
    adapter = _lora(other, tmp_path / "adapter", target_modules=["q_proj", "v_proj"])
    shutil.rmtree(other)  # moved or deleted: only the adapter's own tensors can tell
    r = _merge(base, adapter, tmp_path / "out", "--alpha", "0.5")
    assert r.exit_code == 2, r.output
    text = _one_line_error(r)
    assert str(adapter) in text and str(base) in text and words in text, text


@pytest.mark.parametrize(("family", "targets"), [("llama", ["q_proj", "v_proj"]), ("gpt2", ["c_attn"])])
def test_an_adapter_of_its_own_base_still_merges(tmp_path, family, targets):
    base, _ = _pair(tmp_path, family)
    adapter = _lora(base, tmp_path / "adapter", target_modules=targets)
    r = _merge(base, adapter, tmp_path / "out", "--alpha", "0.5")
    assert r.exit_code == 0, r.output
    merged = load_file(tmp_path / "out" / "model.safetensors")
    before = load_file(base / "model.safetensors")
    assert any(not torch.equal(merged[n], before[n]) for n in before)


# ---------------------------------------------------------------------------------------------------- --alpha
def test_alphas_that_name_one_folder_are_refused(tmp_path):
    base, tuned = _pair(tmp_path, "llama")
    r = _merge(base, tuned, tmp_path / "out", "--alpha", "0.5,0.5000001")
    assert r.exit_code == 2, r.output
    text = _one_line_error(r)
    assert "--alpha" in text and "0.5000001" in text and "alpha-0.5" in text, text
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["", " ", ",", " , "])
def test_an_empty_alpha_says_it_is_empty(tmp_path, value):
    base, tuned = _pair(tmp_path, "llama")
    r = _merge(base, tuned, tmp_path / "out", "--alpha", value)
    assert r.exit_code == 2, r.output
    text = _one_line_error(r)
    assert "--alpha" in text and "empty" in text and "missing" not in text, text


# ------------------------------------------------------------------------------------------------ a killed merge
def test_a_killed_merge_folder_names_the_merge_fix_and_is_never_accepted(tmp_path):
    base, tuned = _pair(tmp_path, "llama")
    out = tmp_path / "out"
    assert _merge(base, tuned, out, "--alpha", "0.5").exit_code == 0
    # what a merge killed while writing leaves: its files recorded, the weights cut short, no merge.json
    (out / "merge.json").unlink()
    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    r = _merge(base, tuned, out, "--alpha", "0.7")
    assert r.exit_code == 2, r.output
    text = _one_line_error(r)
    assert "--overwrite" in text and "--resume" not in text, text
    r = _merge(base, tuned, out, "--alpha", "0.7", "--overwrite")
    assert r.exit_code == 0, r.output
    _check_closed_form(base, tuned, out, "uniform", 0.7)


# ------------------------------------------------------------------------------------------------------ the guard
def _hashes(paths):
    out = {}
    for root in paths:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for f in files:
            out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
        if root.is_dir():
            out[str(root) + "/"] = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    return out


def test_no_merge_modifies_any_input(tmp_path, text_file, alpaca_file):
    base, tuned = _pair(tmp_path, "llama")
    adapter = _lora(base, tmp_path / "adapter", target_modules=["q_proj", "v_proj"])
    bad, _ = _pair(tmp_path, "llama", seed=2)
    _poison(bad, "model.norm.weight")
    inputs = [base, tuned, adapter, bad, text_file, alpaca_file]
    before = _hashes(inputs)
    measure = ["--ood-eval", str(text_file), "--eval-dataset", str(alpaca_file), "--max-length", "128"]
    runs = [
        ([base, tuned, "o1", "--alpha", "0.5,1.0", *measure, "--eval-cache", str(tmp_path / "cache")], 0),
        ([base, adapter, "o2", "--alpha", "0.5", "--llrd", "0.8"], 0),
        ([base, tuned, "o1", "--alpha", "0.25", "--overwrite", *measure], 0),
        ([base, bad, "o3", "--alpha", "0.5"], 2),
        ([bad, tuned, "o4", "--alpha", "0.5", *measure], 2),
        ([base, tuned, "o5", "--alpha", "0.5,0.5000001"], 2),
    ]
    for (b, t, out, *args), code in runs:
        r = _merge(b, t, tmp_path / out, *args)
        assert r.exit_code == code, r.output
    assert _hashes(inputs) == before
    assert json.loads((tmp_path / "o1" / "merge_results.json").read_text())["points"]


def test_a_refused_overwrite_puts_the_previous_merge_back(tmp_path):
    base, tuned = _pair(tmp_path, "llama")
    out = tmp_path / "out"
    assert _merge(base, tuned, out, "--alpha", "0.5").exit_code == 0
    before = _hashes([out])
    bad, _ = _pair(tmp_path, "llama", seed=2)
    _poison(bad, "model.norm.weight")
    r = _merge(base, bad, out, "--alpha", "0.7", "--overwrite")
    assert r.exit_code == 2 and "model.norm.weight" in r.output, r.output
    assert _hashes([out]) == before
    _check_closed_form(base, tuned, out, "uniform", 0.5)
