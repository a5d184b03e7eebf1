"""The weight check before every checkpoint and the final save: a NaN/inf anywhere is found and named, and finite
weights are never reported, even when their float32 sum overflows (the fast path sums each tensor)."""

import pytest

torch = pytest.importorskip("torch")

from posttrainllm.rundir.checkpoints import nonfinite_parameters  # noqa: E402


def two_layers(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)).to(dtype)


def test_finite_weights_report_nothing():
    assert nonfinite_parameters(two_layers()) == []


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_single_nonfinite_element_is_named(bad):
    model = two_layers()
    with torch.no_grad():
        model[1].weight[1, 2] = bad
    assert nonfinite_parameters(model) == ["1.weight"]


def test_plus_and_minus_inf_in_one_tensor_are_found():
    model = two_layers()
    with torch.no_grad():
        model[0].bias[0], model[0].bias[1] = float("inf"), float("-inf")  # their sum is NaN, not inf
    assert nonfinite_parameters(model) == ["0.bias"]


def test_finite_weights_whose_sum_overflows_are_not_reported():
    model = two_layers()
    big = torch.finfo(torch.float32).max
    with torch.no_grad():
        model[0].weight.fill_(big)  # 12 × 3.4e38: the float32 sum is inf, every element is finite
    assert torch.isinf(model[0].weight.sum())
    assert nonfinite_parameters(model) == []


def test_float64_weights_beyond_float32_range_are_finite():
    model = two_layers(torch.float64)
    with torch.no_grad():
        model[1].weight.fill_(1e300)
    assert nonfinite_parameters(model) == []
    with torch.no_grad():
        model[1].bias[0] = float("nan")
    assert nonfinite_parameters(model) == ["1.bias"]


def test_at_most_limit_names():
    model = two_layers()
    with torch.no_grad():
        for p in model.parameters():
            p.view(-1)[0] = float("nan")
    assert nonfinite_parameters(model, limit=2) == ["0.weight", "0.bias"]
