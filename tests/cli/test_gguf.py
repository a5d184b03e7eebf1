"""GGUF files as a model source (posttrainllm/models/gguf.py, models.resolve_model), on tiny llama GGUF files that the
tests write with the gguf package's writer, laid out as llama.cpp's convert_hf_to_gguf.py lays them out (q/k rows
permuted for its rotary embedding, a "gpt2" byte-level BPE vocabulary): the converted model gives the original's logits
and token ids; sft/dpo/eval/generate take the file; bad sources exit 2 in one line; the conversion is cached per file
version. A slow test runs the real SmolLM2-135M-Instruct Q4_1 file when it is present."""

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import build_tiny_model, build_tokenizer
from harness import cli_args
from typer.testing import CliRunner

from posttrainllm import models
from posttrainllm.cli import app
from posttrainllm.errors import UsageError
from posttrainllm.models import gguf as pgguf

gguf = pytest.importorskip("gguf")
runner = CliRunner()

SAMPLE = "the quick brown fox <|endoftext|> def add(a, b):\n    return a + b  naïve café — 日本 <|im_start|>hi"
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"


# ------------------------------------------------------------------------------------------------ writing a GGUF
def llama_cpp_permute(w, n_head: int, n_head_kv: int):
    """convert_hf_to_gguf.py's LlamaModel.permute: q/k rows reordered for llama.cpp's rotary embedding."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, model, tok, qtype=None, arch="llama", permute=True, chat_template=None):
    """A llama GGUF of `model` and `tok`: 2-D weights quantized to `qtype` (None: F32), norms in F32; without
    output.weight when the model ties its embeddings (as llama.cpp writes it); `chat_template` as its
    tokenizer.chat_template."""
    import numpy as np

    cfg = model.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny test llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(cfg.hidden_size // heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)

    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))  # dense ids, as a GGUF token list needs
    special = set(tok.all_special_tokens)
    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_bos_token_id(tok.bos_token_id)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if not cfg.tie_word_embeddings:
        names["lm_head.weight"] = "output.weight"
    parts = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for i in range(cfg.num_hidden_layers):
        names.update({f"model.layers.{i}.{hf}.weight": f"blk.{i}.{g}.weight" for hf, g in parts.items()})
    state = model.state_dict()
    for hf_name, name in names.items():
        a = state[hf_name].detach().float().numpy()
        if permute and name.endswith("attn_q.weight"):
            a = llama_cpp_permute(a, heads, heads)
        elif permute and name.endswith("attn_k.weight"):
            a = llama_cpp_permute(a, heads, kv_heads)
        a = np.ascontiguousarray(a, dtype=np.float32)
        if qtype is not None and a.ndim == 2:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


class Tiny:
    """A 2-block llama (hidden 64: every matrix row is a multiple of the 32-element quant block) and its tokenizer,
    saved in HF format, with GGUF files of it: F32, Q4_0, Q8_0 and a tied-embedding F32 one."""

    def __init__(self, root: Path):
        torch.manual_seed(0)
        self.tok = build_tokenizer()
        self.model = build_tiny_model(self.tok, n_layers=2, hidden=64).eval()
        self.hf_dir = root / "hf"
        self.model.save_pretrained(self.hf_dir)
        self.tok.save_pretrained(self.hf_dir)
        files = root / "files"
        files.mkdir()
        self.f32 = write_gguf(files / "tiny.gguf", self.model, self.tok)
        self.q4 = write_gguf(files / "tiny.Q4_0.gguf", self.model, self.tok, gguf.GGMLQuantizationType.Q4_0)
        self.q8 = write_gguf(files / "tiny.Q8_0.gguf", self.model, self.tok, gguf.GGMLQuantizationType.Q8_0)
        torch.manual_seed(1)
        self.tied_model = build_tiny_model(self.tok, n_layers=2, hidden=64, tie_word_embeddings=True).eval()
        self.tied = write_gguf(files / "tied.gguf", self.tied_model, self.tok)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return Tiny(tmp_path_factory.mktemp("gguf-tiny"))


@pytest.fixture(autouse=True)
def cache(request, tmp_path, monkeypatch):
    """Conversions go under tmp_path in every test (subprocesses inherit it); the slow real-model test decides
    for itself."""
    if request.node.get_closest_marker("slow"):
        return None
    root = tmp_path / "cache"
    monkeypatch.setenv(pgguf.CACHE_ENV, str(root))
    return root


def copy_to(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(src.read_bytes())
    return dst


def logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def assert_one_line_usage_error(r, *fragments):
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    hits = [line for line in lines if all(f in line for f in fragments)]
    assert hits, r.output  # every fragment on one line of the message
    assert len(lines) == 1, r.output  # the error alone, no dump


def sft_args(model, data, out, *extra):
    args = cli_args("sft", model, data, out, batch_size=4)
    return args + ["--max-length", "128", "--logging-steps", "1", *extra]


# ------------------------------------------------------------------------------- 1. layout and tokenizer round trip
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_converted_gguf_gives_the_original_logits_and_token_ids(tiny, tied, cache):
    from transformers import AutoTokenizer

    src, original = (tiny.tied, tiny.tied_model) if tied else (tiny.f32, tiny.model)
    model_path, info = models.resolve_model(str(src))
    assert Path(model_path).parent == cache / "gguf"
    n_matrices, n_norms = 2 + 7 * 2 - tied, 1 + 2 * 2
    assert info["architecture"] == "llama" and info["quantization"] == "F32" and info["bits"] == 32
    assert info["tensor_types"] == {"F32": n_matrices + n_norms}
    assert info["name"] == "tiny test llama" and info["file"] == str(src.resolve())

    config = json.loads((Path(model_path) / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == 64 and config["num_key_value_heads"] == 2
    assert config["tie_word_embeddings"] is tied
    assert (Path(model_path) / "model.safetensors").is_file()

    tok = AutoTokenizer.from_pretrained(model_path)  # an ordinary directory: no gguf_file
    want = tiny.tok(SAMPLE)["input_ids"]
    assert tok(SAMPLE)["input_ids"] == want
    assert tok.decode(want) == tiny.tok.decode(want)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|endoftext|>", "<|endoftext|>", "<|pad|>")

    model = models.load_model(model_path).eval()
    if tied:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    got, expected = logits(model, want), logits(original, want)
    assert got.shape == (len(want), len(tiny.tok))
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_q_k_layout_is_observable(tiny, tmp_path):
    """The control of the test above: q/k written without llama.cpp's permutation give other logits, so equal
    logits do prove the layout."""
    from transformers import AutoModelForCausalLM

    bad = write_gguf(tmp_path / "unpermuted.gguf", tiny.model, tiny.tok, permute=False)
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=bad.name, dtype=torch.float32).eval()
    ids = tiny.tok(SAMPLE)["input_ids"]
    assert (logits(model, ids) - logits(tiny.model, ids)).abs().max() > 1e-3


def test_quantized_gguf_is_close_to_the_original(tiny):
    """Q8_0 and Q4_0 files dequantize to weights near the original (Q8 nearer), so their logits are near too."""
    ids = tiny.tok(SAMPLE)["input_ids"]
    expected = logits(tiny.model, ids)
    errors = {}
    for name, src in (("Q8_0", tiny.q8), ("Q4_0", tiny.q4)):
        model_path, info = models.resolve_model(str(src))
        assert info["quantization"] == name and info["tensor_types"] == {"F32": 5, name: 16}
        errors[name] = (logits(models.load_model(model_path).eval(), ids) - expected).abs().max().item()
    assert 0 < errors["Q8_0"] < errors["Q4_0"] < 0.5 * expected.abs().max().item()


# ------------------------------------------------------------------------- 2. sft → a plain model; eval, generate
def test_sft_on_a_gguf_saves_a_plain_model_that_eval_and_generate_read(tiny, alpaca_file, text_file, tmp_path, cache):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "out"
    r = invoke(*sft_args(tiny.f32, alpaca_file, out, "--max-steps", "2", "--lr", "1e-3"))
    assert r.exit_code == 0, r.output
    assert "tiny.gguf (GGUF, F32, dequantized)" in r.output
    assert "quantization error" not in r.output  # a 32-bit file: nothing to repair

    assert not list(out.glob("*.gguf")) and (out / "model.safetensors").is_file()
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok(SAMPLE)["input_ids"] == tiny.tok(SAMPLE)["input_ids"]
    before, after = tiny.model.state_dict(), load_file(str(out / "model.safetensors"))
    assert set(after) == set(before)
    assert any(not torch.equal(after[n], before[n]) for n in after)  # it trained
    assert type(model).__name__ == "LlamaForCausalLM"

    run_config = json.loads((out / "run_config.json").read_text())
    assert run_config["model"] == str(tiny.f32)
    source = run_config["model_source"]
    assert source["file"] == str(tiny.f32.resolve())
    assert (source["architecture"], source["quantization"], source["bits"]) == ("llama", "F32", 32)
    assert Path(source["converted_to"]).parent == cache / "gguf"
    assert "ref_model_source" not in run_config
    card = (out / "README.md").read_text()
    assert "GGUF" in card and "F32" in card

    ppl = {}
    for name, ref in (("hf", tiny.hf_dir), ("gguf", tiny.f32), ("trained", out)):
        r = invoke("eval", "--model", ref, "--text", text_file, "--max-length", "48", "--json")
        assert r.exit_code == 0, r.output
        ppl[name] = json.loads(r.stdout)[text_file.name]["perplexity"]
    assert ppl["gguf"] == pytest.approx(ppl["hf"], rel=1e-4)  # the file is the original model
    assert ppl["trained"] != pytest.approx(ppl["hf"], rel=1e-4)

    completions = {}
    for name, ref in (("hf", tiny.hf_dir), ("gguf", tiny.f32), ("trained", out)):
        r = invoke("generate", "--model", ref, "--prompt", "the quick brown", "--max-new-tokens", "6")
        assert r.exit_code == 0, r.output
        completions[name] = r.stdout
    assert completions["gguf"] == completions["hf"] and completions["hf"].strip()


# -------------------------------------------------------------------------------------------------- 3. sources, errors
def test_a_directory_holding_one_gguf_is_that_file(tiny, tmp_path, text_file):
    d = tmp_path / "one"
    copy_to(tiny.f32, d / "model.gguf")
    (d / "notes.txt").write_text("not a model")
    assert pgguf.find_gguf(str(d)) == d / "model.gguf"
    model_path, info = models.resolve_model(str(d))
    assert info["file"] == str((d / "model.gguf").resolve()) and Path(model_path).name.startswith("model-")
    r = invoke("eval", "--model", d, "--text", text_file, "--max-length", "48", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)[text_file.name]["perplexity"] > 1


def test_a_model_directory_is_not_a_gguf_source(tiny):
    assert pgguf.find_gguf(str(tiny.hf_dir)) is None
    assert models.resolve_model(str(tiny.hf_dir)) == (str(tiny.hf_dir), None)


def _two_files(tiny, tmp_path):
    d = tmp_path / "two"
    copy_to(tiny.f32, d / "a.gguf")
    copy_to(tiny.q4, d / "b.Q4_0.gguf")
    return d, ("a.gguf", "b.Q4_0.gguf", "2 GGUF files")


def _not_gguf(tiny, tmp_path):
    p = tmp_path / "x.gguf"
    p.write_text("this is not a GGUF file\n")
    return p, ("x.gguf", "not a GGUF file")


def _truncated(tiny, tmp_path):
    p = tmp_path / "cut.gguf"
    p.write_bytes(tiny.f32.read_bytes()[:40])
    return p, ("cut.gguf", "cannot read the GGUF header")


def _unknown_architecture(tiny, tmp_path):
    p = write_gguf(tmp_path / "foo.gguf", tiny.model, tiny.tok, arch="foo")
    return p, ("foo.gguf", "architecture 'foo'", "llama", "original Hugging Face checkpoint")


@pytest.mark.parametrize("case", [_two_files, _not_gguf, _truncated, _unknown_architecture])
@pytest.mark.parametrize("command", ["sft", "generate", "dpo-ref"])
def test_bad_gguf_sources_exit_2_in_one_line(case, command, tiny, tmp_path, alpaca_file, preference_file, cache):
    ref, fragments = case(tiny, tmp_path)
    out = tmp_path / "out"
    if command == "sft":
        r = invoke(*sft_args(ref, alpaca_file, out, "--dry-run"))
        what = "--model"
    elif command == "generate":
        r = invoke("generate", "--model", ref, "--prompt", "hi")
        what = "--model"
    else:
        r = invoke("dpo", "--model", tiny.hf_dir, "--ref-model", ref, "--dataset", preference_file, "--output-dir", out)
        what = "--ref-model"
    assert_one_line_usage_error(r, what, *fragments)
    assert not (cache / "gguf").exists() or not [p for p in (cache / "gguf").iterdir() if p.is_dir()]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3", "phi3", "qwen2moe", "qwen3moe", "gpt-oss"])
def test_the_architecture_is_read_under_the_name_llama_cpp_writes(arch, tiny, tmp_path):
    """A file's general.architecture is llama.cpp's name: a Qwen3-MoE file says "qwen3moe" (transformers lists
    it as qwen3_moe and renames it when reading), and is accepted."""
    p = write_gguf(tmp_path / f"{arch}.gguf", tiny.model, tiny.tok, arch=arch)
    assert pgguf.inspect(p)["architecture"] == arch


def test_every_architecture_transformers_reads_gguf_files_of_is_accepted(tmp_path):
    """The file names transformers has a GGUF tensor processor for are accepted; an unknown one is a UsageError
    naming it and the way out."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS

    p = tmp_path / "m.gguf"
    for name in TENSOR_PROCESSORS:
        pgguf.check_architecture(name, p)
    for name in ("qwen9", None, "general", "tokenizer"):
        with pytest.raises(UsageError, match=f"architecture {name!r}.*original Hugging Face checkpoint"):
            pgguf.check_architecture(name, p)


# ------------------------------------------------------------------------------------- 4. quantization in the banner
@pytest.mark.parametrize("which,warned", [("q4", True), ("q8", False), ("f32", False)])
def test_banner_names_the_quantization_and_warns_at_4_bits(which, warned, tiny, alpaca_file, tmp_path):
    src = getattr(tiny, which)
    quant = {"q4": "Q4_0", "q8": "Q8_0", "f32": "F32"}[which]
    r = invoke(*sft_args(src, alpaca_file, tmp_path / "out", "--dry-run"))
    assert r.exit_code == 0, r.output
    assert f"{src.name} (GGUF, {quant}, dequantized)" in r.output
    flat = " ".join(r.output.split())
    assert ("training starts from their quantization error" in flat) is warned, r.output
    if warned:
        assert "Q4_0 GGUF file (4 bits per weight)" in flat


@pytest.mark.parametrize("qtype", list(gguf.GGMLQuantizationType), ids=lambda t: t.name)
def test_nominal_bits_are_the_bits_the_type_stores(qtype):
    """The nominal bits of every GGML type: at most what a block actually stores per weight, within 2.5 bits (the
    block's scales); so a 4-bit type (Q4_K, IQ4_XS, MXFP4) reads as 4 and gets the low-bit warning."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    stored = size * 8 / block
    bits = pgguf.nominal_bits(qtype.name)
    assert bits <= stored < bits + 2.5
    note = pgguf.low_bit_note({"quantization": qtype.name, "bits": bits})
    assert (note is not None) is (stored <= 5), (qtype.name, bits, stored)


# ------------------------------------------------------------------------------------------------------ 5. the cache
def test_conversion_is_cached_per_file_version(tiny, tmp_path, monkeypatch, cache):
    calls = []
    real = pgguf._write_converted
    monkeypatch.setattr(pgguf, "_write_converted", lambda *a: (calls.append(a[0]), real(*a))[1])
    src = copy_to(tiny.f32, tmp_path / "m" / "tiny.gguf")

    first, _ = models.resolve_model(str(src))
    record = Path(first) / pgguf.SOURCE_FILE
    stamp = record.stat().st_mtime_ns
    saved = json.loads(record.read_text())
    assert saved["size"] == src.stat().st_size and saved["sha256"] == pgguf.sha256(src) and len(saved["sha256"]) == 64
    assert saved["quantization"] == "F32" and pgguf.read_source(first) == saved

    second, _ = models.resolve_model(str(src))
    r = invoke("generate", "--model", src, "--prompt", "hello", "--max-new-tokens", "2")
    assert r.exit_code == 0, r.output
    assert second == first and len(calls) == 1 and record.stat().st_mtime_ns == stamp

    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))  # touched: another version
    touched, _ = models.resolve_model(str(src))
    assert touched != first and len(calls) == 2 and Path(first).is_dir()

    write_gguf(src, tiny.model, tiny.tok, gguf.GGMLQuantizationType.Q8_0)  # replaced by another file
    replaced, info = models.resolve_model(str(src))
    assert replaced not in (first, touched) and len(calls) == 3 and info["quantization"] == "Q8_0"
    assert pgguf.read_source(replaced)["sha256"] != saved["sha256"]

    (Path(replaced) / pgguf.SOURCE_FILE).unlink()  # a directory without its record: an unfinished conversion
    again, _ = models.resolve_model(str(src))
    assert again == replaced and len(calls) == 4 and pgguf.read_source(again)["quantization"] == "Q8_0"
    dirs = sorted(p.name for p in (cache / "gguf").iterdir() if p.is_dir())
    assert len(dirs) == 3 and all(n.startswith("tiny-") for n in dirs)  # no leftover temporary directory


def test_a_converted_files_header_is_not_read_again(tiny, tmp_path, monkeypatch, cache):
    src = copy_to(tiny.q8, tmp_path / "m" / "tiny.gguf")
    first, info = models.resolve_model(str(src))
    reads = []
    real = pgguf.inspect
    monkeypatch.setattr(pgguf, "inspect", lambda *a, **k: (reads.append(a[0]), real(*a, **k))[1])
    second, again = models.resolve_model(str(src))
    assert second == first and again == info and reads == []  # the record answered: what the banner shows is the same
    assert info["quantization"] == "Q8_0" and info["file"] == str(src.resolve())
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))  # another version: read and converted anew
    models.resolve_model(str(src))
    assert reads == [src]


# -------------------------------------------------------------------------------------------------------- 6. dpo
def test_dpo_with_a_gguf_model_and_reference(tiny, preference_file, tmp_path):
    out = tmp_path / "dpo"
    args = cli_args("dpo", tiny.f32, preference_file, out, ref_model=tiny.q4)
    r = invoke(*args, "--max-steps", "1", "--batch-size", "2", "--max-length", "64", "--logging-steps", "1")
    assert r.exit_code == 0, r.output
    assert "tiny.gguf (GGUF, F32, dequantized)" in r.output
    run_config = json.loads((out / "run_config.json").read_text())
    assert run_config["ref_model"] == str(tiny.q4)
    assert run_config["model_source"]["quantization"] == "F32"
    assert run_config["ref_model_source"]["quantization"] == "Q4_0"
    assert run_config["ref_model_source"]["file"] == str(tiny.q4.resolve())
    assert (out / "model.safetensors").is_file()


def test_dpo_reference_gguf_with_its_converted_model_dir(tiny, preference_file, tmp_path):
    converted, _ = models.resolve_model(str(tiny.f32))
    out = tmp_path / "dpo"
    args = cli_args("dpo", converted, preference_file, out, ref_model=tiny.f32)
    r = invoke(*args, "--max-steps", "1", "--batch-size", "2", "--max-length", "64", "--logging-steps", "1")
    assert r.exit_code == 0, r.output
    run_config = json.loads((out / "run_config.json").read_text())
    assert "model_source" not in run_config  # a model directory, even a converted one, is not a GGUF source
    assert run_config["ref_model_source"]["converted_to"] == converted


# ------------------------------------------------------------------------------------------------ 7. the real file
def _real_file() -> Path | None:
    roots = [os.environ.get(pgguf.CACHE_ENV), os.path.join(os.path.expanduser("~"), ".cache", "posttrainllm")]
    for root in filter(None, roots):
        p = Path(root) / "smollm2" / SMOLLM2
        if p.is_file():
            return p
    return None


@pytest.mark.slow
def test_real_smollm2_q4_1_answers_paris(tmp_path, monkeypatch):
    """The real SmolLM2-135M-Instruct Q4_1 file (bench/smollm2.py fetches it): llama, Q4_1, and its greedy answer
    names Paris. Uses the converted copy in the user's cache when there is one; else converts under tmp_path."""
    src = _real_file()
    if src is None:
        pytest.skip(f"{SMOLLM2} not found under $POSTTRAINLLM_CACHE/smollm2 or ~/.cache/posttrainllm/smollm2")
    info = pgguf.inspect(src)
    assert (info["architecture"], info["quantization"], info["bits"]) == ("llama", "Q4_1", 4)
    if pgguf.read_source(pgguf.converted_dir(src)) is None:  # never write into the user's cache from a test
        monkeypatch.setenv(pgguf.CACHE_ENV, str(tmp_path / "cache"))
    r = invoke("generate", "--model", src, "--prompt", "What is the capital of France?", "--max-new-tokens", "20")
    assert r.exit_code == 0, r.output
    assert "Paris" in r.stdout, r.output


# -------------------------------------------------------------------------------- a cache that cannot be written
def _safetensor_error():
    from safetensors import SafetensorError

    return SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


@pytest.mark.parametrize(
    "how",
    ["not_a_directory", "no_space", "safetensors"],
)
def test_a_cache_that_cannot_be_written_names_posttrainllm_cache(how, tiny, tmp_path, monkeypatch, alpaca_file):
    import errno

    src = copy_to(tiny.f32, tmp_path / "m" / "tiny.gguf")
    if how == "not_a_directory":
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        monkeypatch.setenv(pgguf.CACHE_ENV, str(blocker / "cache"))
    else:
        error = OSError(errno.ENOSPC, "No space left on device") if how == "no_space" else _safetensor_error()

        def full(path, tmp, trust):
            tmp.mkdir(parents=True)
            raise error

        monkeypatch.setattr(pgguf, "_write_converted", full)
    r = invoke(*sft_args(src, alpaca_file, tmp_path / "o", "--dry-run"))
    assert r.exit_code == 1, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    assert "cannot write the converted model of tiny.gguf to the cache" in lines[0]
    assert f"set {pgguf.CACHE_ENV} to a writable directory with room" in lines[0]
    leftovers = [p.name for p in (tmp_path / "cache" / "gguf").glob("*")] if how != "not_a_directory" else []
    assert not [n for n in leftovers if ".tmp-" in n]  # no half-written conversion stays


# ----------------------------------------------------------------------------- a hostile chat template in the file
BOMBS = {
    "six_gigabytes": "{{ 'x' * 6000000000 }}",
    "nested_loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
}


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_a_gguf_chat_template_bomb_exits_2_within_seconds_naming_it(bomb, tiny, tmp_path, alpaca_file):
    import time

    (tmp_path / "m").mkdir()
    src = write_gguf(tmp_path / "m" / "bomb.gguf", tiny.model, tiny.tok, chat_template=BOMBS[bomb])
    t0 = time.monotonic()
    r = invoke(*sft_args(src, alpaca_file, tmp_path / "o", "--dry-run"))
    assert time.monotonic() - t0 < 90  # the render is bounded at 5 s, the rest is loading and converting
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "bomb.gguf (tokenizer.chat_template)" in errors[0], r.output
    assert "is refused" in errors[0] and not (tmp_path / "o" / "param_groups.json").exists()
