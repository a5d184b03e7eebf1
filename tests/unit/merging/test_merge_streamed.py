"""merge_streamed checks every piece it reads and writes: a NaN or an infinity in the base, the tuned model or the
merge itself raises NonFiniteTensor naming the side and the tensor; finite inputs of every dtype pass unchanged."""

import math

import pytest
import torch

from posttrainllm.merging import NonFiniteTensor, SafetensorsSource, StateDictSource, interpolate, merge_streamed


def _sources(b, t):
    return StateDictSource(b), StateDictSource(t)


def _state(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(8, 4, generator=g).to(dtype), "b.bias": torch.randn(4, generator=g).to(dtype)}


@pytest.mark.parametrize("side", ["base", "tuned"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_input_names_its_side_and_tensor(tmp_path, side, value):
    b, t = _state(0), _state(1)
    bad = b if side == "base" else t
    bad["b.bias"][2] = value
    with pytest.raises(NonFiniteTensor) as e:
        merge_streamed(*_sources(b, t), lambda name: 0.5, tmp_path, piece_bytes=16)
    assert (e.value.side, e.value.name) == (side, "b.bias")


def test_a_merge_that_overflows_is_caught_as_the_merged_side(tmp_path):
    b, t = {"w": torch.full((2, 2), -3e38)}, {"w": torch.full((2, 2), 3e38)}
    assert not torch.isfinite(interpolate(b["w"], t["w"], 0.25)).all()  # the difference overflows in float32
    with pytest.raises(NonFiniteTensor) as e:
        merge_streamed(*_sources(b, t), lambda name: 0.25, tmp_path)
    assert (e.value.side, e.value.name) == ("merged", "w")


@pytest.mark.parametrize(("s", "bad_side"), [(1.0, "base"), (0.0, "tuned")])
def test_a_side_the_merge_does_not_read_does_not_matter(tmp_path, s, bad_side):
    """At s = 1 the result is the tuned tensor (the base is not read), at s = 0 the base's: a NaN in the other is
    not in the result."""
    from safetensors.torch import load_file

    b, t = _state(0), _state(1)
    (b if bad_side == "base" else t)["a.weight"][0, 0] = math.nan
    merge_streamed(*_sources(b, t), lambda name: s, tmp_path)
    got = load_file(tmp_path / "model.safetensors")
    want = t if s == 1.0 else b
    assert all(torch.equal(got[n], want[n]) for n in want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn])
def test_finite_inputs_of_every_dtype_merge(tmp_path, dtype):
    from safetensors.torch import load_file

    b, t = _state(0, dtype), _state(1, dtype)
    merge_streamed(*_sources(b, t), lambda name: 0.5, tmp_path)
    got = load_file(tmp_path / "model.safetensors")
    for n in b:
        assert got[n].dtype == dtype and torch.equal(got[n].float(), interpolate(b[n], t[n], 0.5).float())


def test_a_safetensors_source_names_the_file_of_each_tensor(tmp_path):
    from safetensors.torch import save_file

    save_file(_state(0), tmp_path / "model.safetensors")
    src = SafetensorsSource(tmp_path)
    assert src.file_of("a.weight") == tmp_path / "model.safetensors"
    assert StateDictSource(_state(0)).file_of("a.weight") is None
