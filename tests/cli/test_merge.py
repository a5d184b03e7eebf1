"""posttrainllm merge: every merged tensor against the closed form θ_base + s·(θ_tuned − θ_base), with s derived here
independently of the library (block index from the name, per-family embedding prefixes, everything else head), on
tiny models of four families; A = 1 / A = 0 bit for bit; a LoRA adapter as the tuned model; the output directory;
every usage error exits 2 before a weight is read."""

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from posttrainllm.cli import app

runner = CliRunner()
N = 3
BLOCK_RE = re.compile(r"(?:layers|h)\.(\d+)\.")
EMBEDDINGS = ("model.embed_tokens.", "transformer.wte.", "transformer.wpe.", "gpt_neox.embed_in.")
_DECODER = dict(
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=N,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
FAMILIES = {
    "llama": dict(_DECODER, tie_word_embeddings=False),
    "qwen2": dict(_DECODER, tie_word_embeddings=True),
    "mistral": dict(_DECODER, tie_word_embeddings=False),
    "gpt2": dict(n_embd=16, n_layer=N, n_head=2, n_positions=64),  # tied by default
}


def _tokenizer(texts=None):
    from conftest import CORPUS, build_tokenizer

    return build_tokenizer(texts or CORPUS)


def _pair(tmp_path, family, *, dtype=torch.float32, tok=None, seed=0, **extra):
    """A base and a tuned model (the base plus noise) of `family`, saved with one tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = tok or _tokenizer()
    kwargs = {**FAMILIES.get(family, _DECODER), **extra}
    cfg = AutoConfig.for_model(family, vocab_size=kwargs.pop("vocab_size", len(tok)), **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).to(dtype)
    dirs = []
    for name in ("base", "tuned"):
        d = tmp_path / f"{family}-{name}-{seed}"
        model.save_pretrained(d)
        tok.save_pretrained(d)
        dirs.append(d)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
    return dirs


def _merge(base, tuned, out, *args):
    return runner.invoke(app, ["merge", "--base", str(base), "--model", str(tuned), "--output-dir", str(out), *args])


def _expected_s(name, schedule, a, gamma=1.0, bottom=None, n=N):
    if schedule == "uniform":
        return a
    m = BLOCK_RE.search(name)
    if m:
        i = int(m.group(1))
    elif name.startswith(EMBEDDINGS):
        i = 0
    else:
        return a  # final norm, head
    return a * gamma ** (n - 1 - i) if schedule == "geometric" else bottom + (a - bottom) * i / (n - 1)


def _check_closed_form(base_dir, tuned_dir, out_dir, schedule, a, gamma=1.0, bottom=None, tuned=None, n=N):
    base = load_file(base_dir / "model.safetensors")
    tuned = tuned if tuned is not None else load_file(tuned_dir / "model.safetensors")
    merged = load_file(out_dir / "model.safetensors")
    assert sorted(merged) == sorted(base)
    for name, b in base.items():
        s = _expected_s(name, schedule, a, gamma, bottom, n)
        want = (b.float() + s * (tuned[name].float() - b.float())).to(tuned[name].dtype)
        torch.testing.assert_close(merged[name], want, rtol=1e-6, atol=1e-7, msg=f"{name}: s = {s}")
    return merged


SCHEDULES = [
    ("uniform", ["--alpha", "0.3", "--depth-schedule", "uniform"], dict(a=0.3)),
    ("geometric", ["--alpha", "0.9", "--llrd", "0.6"], dict(a=0.9, gamma=0.6)),
    ("linear", ["--alpha", "0.8", "--depth-schedule", "linear", "--bottom-alpha", "0.2"], dict(a=0.8, bottom=0.2)),
]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize(("schedule", "args", "values"), SCHEDULES, ids=[s[0] for s in SCHEDULES])
def test_every_tensor_matches_the_closed_form(tmp_path, family, schedule, args, values):
    base, tuned = _pair(tmp_path, family)
    out = tmp_path / "out"
    r = _merge(base, tuned, out, *args)
    assert r.exit_code == 0, r.output
    _check_closed_form(base, tuned, out, schedule, **values)
    record = json.loads((out / "merge.json").read_text())
    assert record["alpha"] == values["a"] and record["schedule"]["name"] == schedule


@pytest.mark.parametrize(("args", "gamma"), [(["--llrd-bottom-scale", "0.64"], 0.8), (["--llrd"], 0.95)])
def test_a_bottom_scale_or_a_bare_llrd_gives_the_geometric_gamma(tmp_path, args, gamma):
    base, tuned = _pair(tmp_path, "llama")
    out = tmp_path / "out"
    r = _merge(base, tuned, out, "--alpha", "0.5", *args)
    assert r.exit_code == 0, r.output
    _check_closed_form(base, tuned, out, "geometric", a=0.5, gamma=gamma)
    assert json.loads((out / "merge.json").read_text())["schedule"]["gamma"] == pytest.approx(gamma, rel=1e-12)


@pytest.mark.parametrize(
    ("family", "extra"),
    [("mixtral", dict(num_local_experts=2, num_experts_per_tok=1)), ("gpt_neox", {})],
)
def test_stored_names_that_transformers_renames_get_their_parameters_depth(tmp_path, family, extra):
    """mixtral stores each expert (the model holds one fused tensor per block); gpt_neox stores its head as
    embed_out.weight (the model's lm_head.weight): each still moves with its own block, the head with alpha."""
    base, tuned = _pair(tmp_path, family, **extra)
    stored = load_file(base / "model.safetensors")
    assert any(".experts.0." in n for n in stored) or "embed_out.weight" in stored
    out = tmp_path / "out"
    r = _merge(base, tuned, out, "--alpha", "0.9", "--depth-schedule", "linear", "--bottom-alpha", "0.3")
    assert r.exit_code == 0, r.output
    _check_closed_form(base, tuned, out, "linear", a=0.9, bottom=0.3)


def test_tied_embedding_moves_like_block_0_or_like_the_head(tmp_path):
    base, tuned = _pair(tmp_path, "qwen2")
    b, t = load_file(base / "model.safetensors"), load_file(tuned / "model.safetensors")
    assert "lm_head.weight" not in b  # tied: one stored matrix
    name = "model.embed_tokens.weight"
    for policy, s in (("embedding", 0.5 * 0.5**2), ("head", 0.5)):
        out = tmp_path / policy
        r = _merge(base, tuned, out, "--alpha", "0.5", "--llrd", "0.5", "--tied-embeddings", policy)
        assert r.exit_code == 0, r.output
        torch.testing.assert_close(load_file(out / "model.safetensors")[name], b[name] + s * (t[name] - b[name]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_alpha_1_is_the_tuned_model_and_alpha_0_the_base_bit_for_bit(tmp_path, family, dtype):
    base, tuned = _pair(tmp_path, family, dtype=dtype)
    for a, src in (("1", tuned), ("0", base)):
        for extra in ([], ["--depth-schedule", "linear", "--bottom-alpha", a]):
            out = tmp_path / f"out-{a}-{len(extra)}"
            assert _merge(base, tuned, out, "--alpha", a, *extra).exit_code == 0
            # the very file: same header (names, order, dtypes, offsets), same bytes
            assert (out / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
            want, got = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
            assert sorted(got) == sorted(want)
            for name in want:
                assert got[name].dtype == want[name].dtype and torch.equal(
                    got[name].view(torch.uint8) if got[name].dim() else got[name], want[name].view(torch.uint8)
                ), name


@pytest.mark.parametrize(("schedule", "args", "values"), SCHEDULES[:2], ids=[s[0] for s in SCHEDULES[:2]])
def test_a_lora_adapter_is_merged_into_its_base_first(tmp_path, schedule, args, values):
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    base, _ = _pair(tmp_path, "llama")
    torch.manual_seed(3)
    lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    adapter = tmp_path / "adapter"
    get_peft_model(AutoModelForCausalLM.from_pretrained(base), lora).save_pretrained(adapter)
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter).merge_and_unload()
    tuned_state = {k: v.detach() for k, v in tuned.state_dict().items()}
    out = tmp_path / "out"
    r = _merge(base, adapter, out, *args)
    assert r.exit_code == 0, r.output
    merged = _check_closed_form(base, None, out, schedule, tuned=tuned_state, **values)
    moved = [n for n in merged if not torch.equal(merged[n], load_file(base / "model.safetensors")[n])]
    assert moved and all("q_proj" in n or "v_proj" in n for n in moved)
    assert json.loads((out / "merge.json").read_text())["model"]["kind"] == "lora"


def test_a_gguf_file_as_base_is_merged_from_its_converted_directory(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    from conftest import build_tiny_model
    from test_gguf import write_gguf

    from posttrainllm.rundir.layout import sha256

    monkeypatch.setenv("POSTTRAINLLM_CACHE", str(tmp_path / "cache"))
    tok = _tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(tok, n_layers=2, hidden=64)
    gguf_file = write_gguf(tmp_path / "base.gguf", model, tok)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    tuned = tmp_path / "tuned"
    model.save_pretrained(tuned)
    tok.save_pretrained(tuned)
    out = tmp_path / "out"
    r = _merge(gguf_file, tuned, out, "--alpha", "0.6", "--llrd", "0.7")
    assert r.exit_code == 0, r.output
    record = json.loads((out / "merge.json").read_text())
    assert record["base"]["kind"] == "gguf" and record["base"]["gguf"]["sha256"] == sha256(gguf_file)
    _check_closed_form(Path(record["base"]["path"]), tuned, out, "geometric", a=0.6, gamma=0.7, n=2)


def test_several_alphas_write_one_loadable_model_each_with_its_record(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrainllm.rundir.layout import sha256

    base, tuned = _pair(tmp_path, "llama")
    out = tmp_path / "sweep"
    r = _merge(base, tuned, out, "--alpha", "0.25,0.75")
    assert r.exit_code == 0, r.output
    for a in (0.25, 0.75):
        d = out / f"alpha-{a:g}"
        record = json.loads((d / "merge.json").read_text())
        assert record["alpha"] == a
        assert record["base"]["sha256"]["model.safetensors"] == sha256(base / "model.safetensors")
        assert record["model"]["sha256"]["model.safetensors"] == sha256(tuned / "model.safetensors")
        model = AutoModelForCausalLM.from_pretrained(d)
        assert AutoTokenizer.from_pretrained(d).get_vocab() == AutoTokenizer.from_pretrained(tuned).get_vocab()
        assert model.config.num_hidden_layers == N and (d / "README.md").is_file()
        _check_closed_form(base, tuned, d, "uniform", a)


def test_a_second_merge_into_the_same_directory_needs_overwrite(tmp_path):
    base, tuned = _pair(tmp_path, "llama")
    out = tmp_path / "out"
    assert _merge(base, tuned, out, "--alpha", "0.5").exit_code == 0
    r = _merge(base, tuned, out, "--alpha", "0.7")
    assert r.exit_code == 2 and "--overwrite" in r.output
    assert _merge(base, tuned, out, "--alpha", "0.7", "--overwrite").exit_code == 0
    assert json.loads((out / "merge.json").read_text())["alpha"] == 0.7
    _check_closed_form(base, tuned, out, "uniform", 0.7)


def test_shards_and_row_blocks_give_the_bits_of_whole_tensors(tmp_path):
    from transformers import AutoModelForCausalLM

    from posttrainllm.merging import SafetensorsSource, interpolate, merge_streamed

    base, tuned = _pair(tmp_path, "llama")
    out = tmp_path / "sharded"
    out.mkdir()
    sources = SafetensorsSource(base), SafetensorsSource(tuned)
    files = merge_streamed(*sources, lambda name: 0.3, out, max_shard_bytes=20_000, piece_bytes=300)
    assert len(files) > 2 and files[-1] == "model.safetensors.index.json"
    (out / "config.json").write_text((tuned / "config.json").read_text())
    merged = AutoModelForCausalLM.from_pretrained(out).state_dict()
    b, t = load_file(base / "model.safetensors"), load_file(tuned / "model.safetensors")
    for name in b:
        assert torch.equal(merged[name], interpolate(b[name], t[name], 0.3)), name


# ------------------------------------------------------------------------------------------------------ errors
@pytest.fixture
def no_weights_read(monkeypatch):
    """Fail the test if a weight tensor is read or a model is built while a usage error is reported."""
    from transformers import AutoModelForCausalLM

    from posttrainllm.merging import tensors

    def boom(*a, **k):
        raise AssertionError("a model or a weight was loaded before the usage error")

    def arm():  # called once the test's models are saved
        monkeypatch.setattr(tensors.SafetensorsSource, "read", boom)
        monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", boom)
        monkeypatch.setattr(AutoModelForCausalLM, "from_config", boom)

    return arm


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--alpha", "1.5"], "--alpha must be in [0, 1]"),
        (["--alpha", "-0.1"], "--alpha must be in [0, 1]"),
        (["--alpha", "0.5,nan"], "--alpha"),
        (["--alpha", "0.5,0.5"], "given more than once"),
        (["--alpha", "0.5", "--depth-schedule", "linear"], "needs --bottom-alpha"),
        (["--alpha", "0.5", "--bottom-alpha", "0.1"], "goes with --depth-schedule linear"),
        (["--alpha", "0.5", "--depth-schedule", "linear", "--bottom-alpha", "1.2"], "--bottom-alpha must be in"),
        (["--alpha", "0.5", "--depth-schedule", "cubic"], "--depth-schedule must be one of"),
        (["--alpha", "0.5", "--depth-schedule", "linear", "--bottom-alpha", "0.1", "--llrd", "0.9"], "not with"),
        (["--alpha", "0.5", "--depth-schedule", "uniform", "--llrd", "0.9"], "not with --depth-schedule uniform"),
        (["--alpha", "0.5", "--depth-schedule", "uniform", "--bottom-alpha", "0.1"], "goes with --depth-schedule"),
        (["--alpha", "0.5", "--llrd", "0.3"], "--llrd must be a number in [0.5, 1.0]"),
        (["--alpha", "0.5", "--llrd", "0.9", "--llrd-bottom-scale", "0.5"], "both set the layer decay"),
        (["--alpha", "0.5", "--discard-weights"], "--discard-weights"),
        (["--alpha", "0.5", "--tied-embeddings", "both"], "--tied-embeddings must be one of"),
        (["--alpha", "0.5", "--ood-eval", "missing.txt"], "text file not found"),
        ([], "missing --alpha"),
    ],
)
def test_bad_options_exit_2_before_a_weight_is_read(tmp_path, no_weights_read, args, words):
    base, tuned = _pair(tmp_path, "llama")
    no_weights_read()
    r = _merge(base, tuned, tmp_path / "out", *args)
    assert r.exit_code == 2, r.output
    assert words in " ".join(r.output.split()), r.output
    assert "Traceback" not in r.output and not (tmp_path / "out").exists()


def test_a_block_list_that_is_not_there_exits_2_before_anything_is_written(tmp_path):
    base, tuned = _pair(tmp_path, "llama")
    r = _merge(base, tuned, tmp_path / "out", "--alpha", "0.5", "--llrd", "0.9", "--llrd-blocks", "model.nope")
    assert r.exit_code == 2 and "--llrd-blocks" in r.output and "model.layers" in r.output, r.output
    assert not (tmp_path / "out").exists()


def test_different_architectures_exit_2_from_the_configs(tmp_path, no_weights_read):
    llama, _ = _pair(tmp_path, "llama")
    _, gpt2 = _pair(tmp_path, "gpt2")
    no_weights_read()
    r = _merge(llama, gpt2, tmp_path / "out", "--alpha", "0.5")
    assert r.exit_code == 2 and "different architectures" in r.output and "gpt2" in r.output, r.output


@pytest.mark.parametrize(
    ("change", "what"),
    [(dict(hidden_size=32, intermediate_size=64), "shapes"), (dict(num_hidden_layers=N + 1), "names")],
)
def test_different_shapes_or_names_exit_2_naming_the_first(tmp_path, no_weights_read, change, what):
    base, _ = _pair(tmp_path, "llama")
    _, tuned = _pair(tmp_path, "llama", seed=1, **change)
    b, t = load_file(base / "model.safetensors"), load_file(tuned / "model.safetensors")
    # the stored order (safetensors headers list tensors by name)
    first = next(n for n in sorted(set(b) | set(t)) if n not in b or n not in t or b[n].shape != t[n].shape)
    no_weights_read()
    r = _merge(base, tuned, tmp_path / "out", "--alpha", "0.5")
    assert r.exit_code == 2 and f"tensor {what}" in r.output and f"tensor {first} " in r.output, r.output


def test_different_tokenizers_exit_2_naming_the_first_token(tmp_path, no_weights_read):
    tok_a, tok_b = _tokenizer(), _tokenizer(["completely other words", "zebra quartz jukebox " * 5])
    vocab = max(len(tok_a), len(tok_b))
    base, _ = _pair(tmp_path, "llama", tok=tok_a, vocab_size=vocab)
    _, tuned = _pair(tmp_path, "llama", tok=tok_b, vocab_size=vocab, seed=1)
    no_weights_read()
    r = _merge(base, tuned, tmp_path / "out", "--alpha", "0.5")
    assert r.exit_code == 2 and "tokenizers differ: token id" in " ".join(r.output.split()), r.output


@pytest.mark.parametrize("where", ["base", "tuned", "inside-base"])
def test_the_output_is_never_an_input_nor_inside_one(tmp_path, no_weights_read, where):
    base, tuned = _pair(tmp_path, "llama")
    out = {"base": base, "tuned": tuned, "inside-base": base / "merged"}[where]
    before = sorted(p.name for p in base.iterdir()), sorted(p.name for p in tuned.iterdir())
    no_weights_read()
    r = _merge(base, tuned, out, "--alpha", "0.5")
    assert r.exit_code == 2 and "--output-dir" in r.output, r.output
    assert (sorted(p.name for p in base.iterdir()), sorted(p.name for p in tuned.iterdir())) == before


def test_an_adapter_of_another_architecture_exits_2(tmp_path, no_weights_read):
    llama, _ = _pair(tmp_path, "llama")
    gpt2, _ = _pair(tmp_path, "gpt2")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(gpt2)}))
    no_weights_read()
    r = _merge(llama, adapter, tmp_path / "out", "--alpha", "0.5")
    assert r.exit_code == 2 and "LoRA adapter of a gpt2 model" in " ".join(r.output.split()), r.output


def test_an_adapter_as_base_is_refused(tmp_path, no_weights_read):
    base, tuned = _pair(tmp_path, "llama")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    no_weights_read()
    r = _merge(adapter, tuned, tmp_path / "out", "--alpha", "0.5")
    assert r.exit_code == 2 and "LoRA adapter" in r.output, r.output


def test_help_describes_every_option():
    from posttrainllm.commands.registry import options_for

    r = runner.invoke(app, ["merge", "--help"], terminal_width=200)
    assert r.exit_code == 0
    for o in options_for("merge"):
        assert o.cli_flag in r.output and o.help


# ---------------------------------------------------------------------------------------------------- the sweep
def test_a_sweep_measures_each_merge_as_eval_does_and_can_discard_the_weights(tmp_path, text_file, alpaca_file):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrainllm import data
    from posttrainllm.evaluate import evaluate_files

    base, tuned = _pair(tmp_path, "llama")
    out = tmp_path / "sweep"
    args = ["--alpha", "0.5,1.0", "--ood-eval", str(text_file), "--eval-dataset", str(alpaca_file)]
    # --precision fp32: the direct evaluation below is fp32 (auto would be bf16 autocast on a CPU with bf16)
    r = _merge(base, tuned, out, *args, "--max-length", "128", "--discard-weights", "--precision", "fp32")
    assert r.exit_code == 0, r.output
    assert "merge frontier" in r.output and not (out / "alpha-0.5").exists() and not (out / "alpha-1").exists()
    results = json.loads((out / "merge_results.json").read_text())
    points = {p["label"]: p for p in results["points"]}
    assert list(points) == ["base", "alpha=0.5", "alpha=1"]
    # alpha = 1 is the tuned model: its numbers are eval's, with the base as the KL reference
    tok = AutoTokenizer.from_pretrained(base)
    ref, model = AutoModelForCausalLM.from_pretrained(base), AutoModelForCausalLM.from_pretrained(tuned)
    direct = evaluate_files(
        model, tok, [str(text_file)], 128, sft_examples=data.load(str(alpaca_file)), progress=False, reference=ref
    )
    name = text_file.name
    got = points["alpha=1"]
    assert got["held_out"][name]["after"] == pytest.approx(direct[name]["perplexity"], rel=1e-6)
    assert got["kl"] == pytest.approx(direct[name]["kl"], rel=1e-6) and got["kl"] > 0
    assert got["eval_loss"] == pytest.approx(direct["sft"]["loss"], rel=1e-6)
    assert points["base"]["kl"] == 0.0 and 0 < points["alpha=0.5"]["kl"] < got["kl"]
    assert all(p["model_dir"] is None for p in results["points"])


def test_the_base_logits_are_replayed_not_recomputed():
    from posttrainllm.merging.frontier import _Recorder

    calls = []

    class Base:
        training = False

        def __call__(self, input_ids, **kwargs):
            calls.append(input_ids)
            return type("Out", (), {"logits": input_ids.float().unsqueeze(-1) * 2})()

    rec = _Recorder(Base())
    batches = [torch.tensor([[1, 2, 3]]), torch.tensor([[4, 5]])]
    first = [rec(b).logits for b in batches]
    for _ in range(2):  # two merges
        replay = rec.replay()
        again = [replay(b).logits for b in batches]
        assert all(torch.equal(a, b) for a, b in zip(first, again)) and replay.replayed == 2
    assert len(calls) == 2
    replay = rec.replay()
    replay(torch.tensor([[9, 9, 9]]))  # not the recorded batch: the base runs
    assert len(calls) == 3


# ---------------------------------------------------------------------------------------------------- memory
_RSS_SCRIPT = r"""
import json, sys
from typer.testing import CliRunner
from posttrainllm.cli import app

def status(key):  # this process's own figures (ru_maxrss would carry the parent's peak across fork and exec)
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

def merge(base, tuned, out, *args):
    r = CliRunner().invoke(app, ["merge", "--base", base, "--model", tuned, "--output-dir", out, *args])
    assert r.exit_code == 0, r.output

small_base, small_tuned, big_base, big_tuned, tmp = sys.argv[1:6]
merge(small_base, small_tuned, tmp + "/warm", "--alpha", "0.5", "--llrd", "0.9")  # imports, first allocations
before = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) starts again from the current RSS
merge(big_base, big_tuned, tmp + "/big", "--alpha", "0.5", "--llrd", "0.9")
print(json.dumps({"before": before, "peak": status("VmHWM")}))
"""


@pytest.mark.slow
def test_peak_memory_of_a_merge_is_a_small_part_of_one_model(tmp_path):
    """A 4-block model of about 370 MB (fp32, large embedding matrices) merged in a fresh process: the peak RSS
    the merge adds over the process's own (imports, a first small merge) stays under 0.3 × one model's size;
    loading the two models would add 2×, and whole embedding matrices 3 × 82 MB. The merge streams blocks of rows."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    small = _pair(tmp_path, "llama")
    big = _pair(
        tmp_path,
        "llama",
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=8,
        vocab_size=20_000,
    )  # fmt: skip: two 82 MB embedding matrices, as a real vocabulary makes them the largest tensors
    size = (big[0] / "model.safetensors").stat().st_size
    assert size > 250e6
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    tests = str(Path(__file__).resolve().parents[1])
    proc = subprocess.run(
        [sys.executable, "-c", _RSS_SCRIPT, *map(str, (*small, *big)), str(tmp_path)],
        capture_output=True, text=True, timeout=600, env=env, cwd=tests,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rss = json.loads(proc.stdout.strip().splitlines()[-1])
    added = rss["peak"] - rss["before"]
    print(f"model {size / 1e6:.0f} MB; process peak {rss['peak'] / 1e6:.0f} MB; the merge added {added / 1e6:.0f} MB")
    assert added < 0.3 * size, (added, size)
