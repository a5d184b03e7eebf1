"""`posttrainllm sft --dry-run` on saved tiny models of every causal-LM family: param_groups.json gives every
trainable parameter exactly once with the LR of the formula; LoRA adapters get their block's LR; an unknown
architecture exits 1 explaining how to point the tool at its block list."""

import json

import pytest
from conftest import build_tokenizer
from families import BASE, FAMILIES, GAMMA, N, expected_scale
from harness import cli_args, run_args
from typer.testing import CliRunner

from posttrainllm.cli import app
from posttrainllm.constants import DEFAULT_TIED_POLICY

runner = CliRunner()
CAUSAL = [f for f, (_, _, kind) in FAMILIES.items() if kind == "causal"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def save_family(family, tokenizer, path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs, _, _ = FAMILIES[family]
    cfg = AutoConfig.for_model(
        family,
        **{
            **kwargs,
            "vocab_size": len(tokenizer),
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
        },
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model


def dry_run(model_dir, data, out, *extra):
    r = runner.invoke(
        app,
        cli_args("sft", model_dir, data, out, *extra, llrd="0.8", lr=BASE, dry_run=True, max_length=256),
    )
    return r


@pytest.mark.parametrize("family", CAUSAL)
def test_dry_run_param_groups_follow_the_formula(family, tokenizer, alpaca_file, tmp_path):
    model = save_family(family, tokenizer, tmp_path / "m")
    r = dry_run(tmp_path / "m", alpaca_file, tmp_path / "o")
    assert r.exit_code == 0, r.output
    groups = json.loads((tmp_path / "o" / "param_groups.json").read_text())
    seen = [n for g in groups for n in g["params"]]
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert sorted(seen) == sorted(trainable)  # every trainable parameter exactly once
    tied = None
    out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
    if out_emb is not None and out_emb.weight is in_emb.weight:
        tied = next(n for n, p in model.named_parameters() if p is in_emb.weight)
        assert "tied" in r.output
    prefixes = FAMILIES[family][1]
    for g in groups:
        for name in g["params"]:
            want = BASE * expected_scale(name, prefixes, tied, DEFAULT_TIED_POLICY)
            assert g["lr"] == pytest.approx(want, rel=1e-9), (
                family,
                name,
            )
    assert f"block_0 LR={BASE * GAMMA ** (N - 1):.2g}".replace("0.00064", "6.4e-04") in r.output


def test_lora_adapters_train_at_their_block_lr(tokenizer, alpaca_file, tmp_path):
    save_family("llama", tokenizer, tmp_path / "m")
    r = dry_run(tmp_path / "m", alpaca_file, tmp_path / "o", "--lora-r", "4", "--lora-targets", "q_proj,v_proj")
    assert r.exit_code == 0, r.output
    groups = json.loads((tmp_path / "o" / "param_groups.json").read_text())
    names = [n for g in groups for n in g["params"]]
    assert names and all("lora_" in n for n in names)
    assert len(names) == N * 2 * 2  # 3 blocks × (q, v) × (A, B)
    for g in groups:
        for name in g["params"]:
            block = int(name.split("layers.")[1].split(".")[0])
            assert g["lr"] == pytest.approx(BASE * GAMMA ** (N - 1 - block))


MODELING = """
import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel


class OddConfig(PretrainedConfig):
    model_type = "odd"

    def __init__(self, vocab_size=300, hidden_size=16, num_hidden_layers=3, **kw):
        self.vocab_size, self.hidden_size, self.num_hidden_layers = vocab_size, hidden_size, num_hidden_layers
        super().__init__(**kw)


class OddForCausalLM(PreTrainedModel):
    config_class = OddConfig

    def __init__(self, config):
        super().__init__(config)
        self.emb = nn.Embedding(config.vocab_size, config.hidden_size)
        width = config.hidden_size
        self.stages = nn.ModuleDict({f"s{i}": nn.Linear(width, width) for i in range(config.num_hidden_layers)})
        self.out = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    def forward(self, input_ids=None, labels=None, **kw):
        h = self.emb(input_ids)
        for s in self.stages.values():
            h = torch.tanh(s(h))
        return {"logits": self.out(h)}
"""


def test_unknown_architecture_exits_1_with_how_to_fix(tokenizer, alpaca_file, tmp_path):
    d = tmp_path / "odd"
    d.mkdir()
    (d / "modeling_odd.py").write_text(MODELING)
    (d / "configuration_odd.py").write_text("from .modeling_odd import OddConfig\n")
    import sys

    sys.path.insert(0, str(d))
    try:
        import modeling_odd

        modeling_odd.OddForCausalLM(modeling_odd.OddConfig(vocab_size=len(tokenizer))).save_pretrained(d)
    finally:
        sys.path.remove(str(d))
    tokenizer.save_pretrained(d)
    (d / "config.json").write_text(
        json.dumps(
            {
                "model_type": "odd",
                "vocab_size": len(tokenizer),
                "hidden_size": 16,
                "num_hidden_layers": 3,
                "architectures": ["OddForCausalLM"],
                "auto_map": {
                    "AutoConfig": "configuration_odd.OddConfig",
                    "AutoModelForCausalLM": "modeling_odd.OddForCausalLM",
                },
            }
        )
    )
    r = dry_run(d, alpaca_file, tmp_path / "o", "--trust-remote-code")
    assert r.exit_code == 1, r.output
    assert "--llrd-blocks" in r.output and "emb.weight" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o" / "param_groups.json").exists()
    # without layer decay the structure does not matter: flat groups, exit 0
    r = runner.invoke(
        app,
        cli_args("sft", d, alpaca_file, tmp_path / "flat", dry_run=True, trust_remote_code=True, max_length=256),
    )
    assert r.exit_code == 0, r.output


def test_remote_code_is_refused_without_the_flag(tokenizer, alpaca_file, tmp_path):
    d = tmp_path / "odd"
    d.mkdir()
    (d / "modeling_odd.py").write_text(MODELING)
    (d / "config.json").write_text(
        json.dumps(
            {
                "model_type": "odd",
                "auto_map": {
                    "AutoConfig": "modeling_odd.OddConfig",
                    "AutoModelForCausalLM": "modeling_odd.OddForCausalLM",
                },
            }
        )
    )
    (d / "model.safetensors").write_bytes(b"")
    tokenizer.save_pretrained(d)
    r = dry_run(d, alpaca_file, tmp_path / "o")
    assert r.exit_code == 2, r.output  # a usage error: the command line lacks --trust-remote-code
    assert "--trust-remote-code" in r.output


@pytest.mark.smoke
def test_max_length_beyond_learned_positions_is_clamped(tokenizer, alpaca_file, tmp_path):
    """gpt2 has learned position embeddings (here 64): the default --max-length 512 would crash; it is clamped."""
    save_family("gpt2", tokenizer, tmp_path / "m")
    data = tmp_path / "pc.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"add {i} and 1", "completion": f" {i + 1}"}) + "\n" for i in range(8))
    )
    r = runner.invoke(
        app,
        run_args("sft", tmp_path / "m", data, tmp_path / "o", steps=1, max_length=None, lr=None, llrd="0.8"),
    )
    assert r.exit_code == 0, r.output
    assert "max length 64" in r.output and "is more than the model's" not in r.output  # the default: no note
    assert "IndexError" not in r.output and "index out of range" not in r.output


def test_a_wrong_llrd_blocks_path_is_a_usage_error_naming_the_option(tiny_model_dir, alpaca_file, tmp_path):
    r = dry_run(tiny_model_dir, alpaca_file, tmp_path / "o", "--llrd-blocks", "model.nope")
    assert r.exit_code == 2, r.output
    assert "--llrd-blocks" in r.output and "model.layers (4)" in r.output and "Traceback" not in r.output
