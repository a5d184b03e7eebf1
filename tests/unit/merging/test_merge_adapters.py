"""A LoRA adapter is checked against --base before peft merges it (posttrainllm/merging/adapters.py): the base it
records, the blocks and shapes its lora_A/lora_B pairs were trained for, the blocks it covers, finite weights."""

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from posttrainllm.errors import UsageError
from posttrainllm.merging import adapters
from posttrainllm.merging.sources import Source

R, HIDDEN = 2, 8


def _stored(blocks=3, hidden=HIDDEN, conv1d=False):
    """A base's stored tensors (name → shape): q/v projections per block, embeddings, head."""
    out = {"model.embed_tokens.weight": (50, hidden), "lm_head.weight": (50, hidden)}
    for i in range(blocks):
        for m in ("q_proj", "v_proj"):
            out[f"model.layers.{i}.self_attn.{m}.weight"] = (hidden, hidden)
        out[f"model.layers.{i}.attn.c_attn.weight"] = (hidden, 3 * hidden) if conv1d else (3 * hidden, hidden)
    return out


def _adapter(tmp_path, blocks=3, hidden=HIDDEN, modules=("q_proj", "v_proj"), config=None, value=None):
    d = tmp_path / "adapter"
    d.mkdir(exist_ok=True)
    state = {}
    for i in range(blocks):
        for m in modules:
            out_dim = 3 * hidden if m == "c_attn" else hidden
            where = "attn" if m == "c_attn" else "self_attn"
            key = f"base_model.model.model.layers.{i}.{where}.{m}"
            state[f"{key}.lora_A.weight"] = torch.randn(R, hidden)
            state[f"{key}.lora_B.weight"] = torch.randn(out_dim, R)
    if value is not None:
        next(iter(state.values()))[0, 0] = value
    save_file(state, d / "adapter_model.safetensors")
    cfg = {"target_modules": list(modules), "base_model_name_or_path": "", **(config or {})}
    (d / "adapter_config.json").write_text(json.dumps(cfg))
    return Source(str(d), d, "lora", config=cfg)


def _base(blocks=3, hidden=HIDDEN):
    return Source(
        "the-base", Path("the-base"), "directory", config={"num_hidden_layers": blocks, "hidden_size": hidden}
    )


def test_an_adapter_of_its_own_base_passes(tmp_path):
    adapters.check_adapter_tensors(_base(), _adapter(tmp_path), _stored())


def test_a_conv1d_weight_stored_transposed_passes(tmp_path):
    adapters.check_adapter_tensors(_base(), _adapter(tmp_path, modules=("c_attn",)), _stored(conv1d=True))


def test_a_block_the_base_does_not_have_is_refused(tmp_path):
    with pytest.raises(UsageError, match=r"model\.layers\.2\.self_attn\.q_proj \(block 2\).*it has 2 blocks"):
        adapters.check_adapter_tensors(_base(2), _adapter(tmp_path, blocks=3), _stored(2))


def test_a_block_the_adapter_does_not_have_is_refused(tmp_path):
    with pytest.raises(UsageError, match=r"no weights for model\.layers\.2\.self_attn\.q_proj \(block 2 of --base\)"):
        adapters.check_adapter_tensors(_base(3), _adapter(tmp_path, blocks=2), _stored(3))


@pytest.mark.parametrize(
    "config", [{"layers_to_transform": [0, 1]}, {"target_modules": ["model.layers.0.self_attn.q_proj"]}]
)
def test_an_adapter_meant_for_some_blocks_only_is_not_asked_for_all(tmp_path, config):
    adapters.check_adapter_tensors(_base(3), _adapter(tmp_path, blocks=2, config=config), _stored(3))


def test_another_width_is_refused_naming_both_shapes(tmp_path):
    with pytest.raises(UsageError, match=r"shape \[16, 16\].*shape \[8, 8\]"):
        adapters.check_adapter_tensors(_base(), _adapter(tmp_path, hidden=16), _stored())


def test_a_module_the_base_lacks_altogether_is_left_to_peft(tmp_path):
    """Not at any block (another naming, a rename transformers makes on loading): not refused here."""
    adapters.check_adapter_tensors(_base(), _adapter(tmp_path, modules=("o_proj",)), _stored())


@pytest.mark.parametrize(("key", "theirs"), [("num_hidden_layers", 4), ("hidden_size", 16)])
def test_the_recorded_base_is_compared_when_it_is_a_local_directory(tmp_path, key, theirs):
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    (recorded / "config.json").write_text(json.dumps({**_base().config, key: theirs}))
    adapter = _adapter(tmp_path, config={"base_model_name_or_path": str(recorded)})
    with pytest.raises(UsageError) as e:
        adapters.check_recorded_base(_base(), adapter)
    text = str(e.value)
    assert str(recorded) in text and "the-base" in text and str(adapter.path) in text and str(theirs) in text


def test_a_recorded_base_that_is_not_a_local_directory_is_not_compared(tmp_path):
    adapters.check_recorded_base(_base(), _adapter(tmp_path, config={"base_model_name_or_path": "org/model"}))


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_adapter_weights_are_refused_naming_the_file(tmp_path, value):
    adapter = _adapter(tmp_path, value=value)
    with pytest.raises(UsageError, match="adapter_model.safetensors holds NaN or infinite values"):
        adapters.check_adapter_finite(adapter)


def test_an_unreadable_adapter_file_is_one_usage_error(tmp_path):
    adapter = _adapter(tmp_path)
    (adapter.path / "adapter_model.safetensors").write_bytes(b"\x01\x00")
    with pytest.raises(UsageError, match="adapter_model.safetensors"):
        adapters.check_adapter_tensors(_base(), adapter, _stored())
    with pytest.raises(UsageError, match="adapter_model.safetensors"):
        adapters.check_adapter_finite(adapter)
