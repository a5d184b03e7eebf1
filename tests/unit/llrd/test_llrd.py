"""Unit tests for posttrainllm.llrd: closed forms of the layer-wise LR decay and the param-group contract."""

import math
import re
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from posttrainllm.llrd import (
    DEFAULT_TIED_POLICY,
    TIED_POLICIES,
    BlockStructureError,
    apply_freeze,
    build_param_groups,
    find_block_list,
)
from posttrainllm.reporting.banner import summary_line

BASE = 1e-3
BLOCK_RE = re.compile(r"(?:layers|stack)\.(\d+)\.")


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        return x + self.proj(self.norm(x))


class Toy(nn.Module):
    """embed + pos (before), `layers` ModuleList, norm + head (after); optional config / tying / list name."""

    def __init__(self, n, d=8, vocab=32, tie=False, list_name="layers", config=True):
        super().__init__()
        self.config = SimpleNamespace(num_hidden_layers=n) if config else None
        self.pos = nn.Parameter(torch.randn(16, d) * 0.02)
        self.embed = nn.Embedding(vocab, d)
        self.list_name = list_name
        setattr(self, list_name, nn.ModuleList(Block(d) for _ in range(n)))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        if tie:
            self.head.weight = self.embed.weight

    def get_input_embeddings(self):
        return self.embed

    def get_output_embeddings(self):
        return self.head

    def forward(self, ids):
        x = self.embed(ids) + self.pos[: ids.shape[1]]
        for block in getattr(self, self.list_name):
            x = block(x)
        return self.head(self.norm(x))


def tiny_llama(n, **kw):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=n,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
        **kw,
    )
    return LlamaForCausalLM(cfg)


def expected_scale(name, n, gamma, embed_prefixes=("pos", "embed.", "model.embed_tokens.")):
    m = BLOCK_RE.search(name)
    if m:
        return gamma ** (n - 1 - int(m.group(1)))
    if name.startswith(embed_prefixes):
        return gamma ** (n - 1)
    return 1.0


def lr_by_param(plan):
    return {name: g["lr"] for g in plan.groups for name in plan.param_names[g["name"]]}


def adam_state_bytes(opt):
    return sum(
        t.numel() * t.element_size()
        for s in opt.state.values()
        for t in s.values()
        if torch.is_tensor(t) and t.dim() > 0
    )


def one_step(model, groups, **kw):
    opt = torch.optim.AdamW(groups, lr=BASE, **kw)
    ids = torch.randint(0, 32, (2, 6))
    model(ids).logsumexp(-1).mean().backward()
    opt.step()
    return opt


@pytest.mark.parametrize("n", [4, 12, 24])
@pytest.mark.parametrize("kind", ["llama", "toy"])
def test_every_depth_gets_gamma_to_the_distance_from_the_top(kind, n):
    model = tiny_llama(n) if kind == "llama" else Toy(n)
    gamma = 0.9
    plan = build_param_groups(model, BASE, gamma)
    assert plan.structure_found and plan.num_layers == n
    lrs = lr_by_param(plan)
    assert set(lrs) == {name for name, _ in model.named_parameters()}
    for name, lr in lrs.items():
        assert math.isclose(lr, BASE * expected_scale(name, n, gamma), rel_tol=1e-12), name
    by_name = {g["name"]: g for g in plan.groups}
    for i in range(n):
        assert math.isclose(by_name[f"block_{i}"]["lr"], BASE * gamma ** (n - 1 - i), rel_tol=1e-12)
        assert math.isclose(by_name[f"block_{i}"]["scale"], gamma ** (n - 1 - i), rel_tol=1e-12)
    assert [r["block"] for r in plan.rows] == ["embeddings"] + [f"block_{i}" for i in range(n)] + ["head"]
    assert [r["depth"] for r in plan.rows] == list(range(n + 2))


def test_embeddings_get_block0_scale_and_head_and_final_norm_get_one():
    model = tiny_llama(4)
    plan = build_param_groups(model, BASE, 0.5)
    assert plan.lr_of("model.embed_tokens.weight") == pytest.approx(BASE * 0.5**3, rel=1e-12)
    assert plan.lr_of("model.embed_tokens.weight") == plan.lr_of("block_0")
    assert plan.lr_of("lm_head.weight") == BASE
    assert plan.lr_of("model.norm.weight") == BASE
    toy = Toy(4)
    plan = build_param_groups(toy, BASE, 0.5)
    assert plan.lr_of("pos") == plan.lr_of("embed.weight") == pytest.approx(BASE / 8)
    assert plan.lr_of("norm.weight") == plan.lr_of("head.weight") == BASE


def test_docstring_worked_example_n4_gamma_half():
    plan = build_param_groups(Toy(4), 1e-3, 0.5)
    got = {r["block"]: r["lr"] for r in plan.rows}
    assert got == pytest.approx(
        {"embeddings": 1.25e-4, "block_0": 1.25e-4, "block_1": 2.5e-4, "block_2": 5e-4, "block_3": 1e-3, "head": 1e-3}
    )


def test_gamma_one_gives_every_parameter_the_base_lr():
    plan = build_param_groups(tiny_llama(4), BASE, 1.0, 0.1)
    assert all(g["lr"] == BASE and g["scale"] == 1.0 for g in plan.groups)
    assert not plan.warnings


def test_each_trainable_parameter_in_exactly_one_group_and_frozen_left_out():
    model = tiny_llama(4)
    model.model.layers[1].mlp.requires_grad_(False)
    model.lm_head.weight.requires_grad_(False)
    plan = build_param_groups(model, BASE, 0.8, 0.1)
    ids = [id(p) for g in plan.groups for p in g["params"]]
    assert len(ids) == len(set(ids))
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert set(ids) == trainable
    names = [n for g in plan.groups for n in plan.param_names[g["name"]]]
    assert len(names) == len(set(names)) == len(ids)
    assert "lm_head.weight" not in names and not any(".layers.1.mlp." in n for n in names)
    for g in plan.groups:  # names and tensors line up
        named = dict(model.named_parameters())
        assert [id(named[n]) for n in plan.param_names[g["name"]]] == [id(p) for p in g["params"]]


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_no_empty_groups_and_at_most_two_per_depth(wd):
    plan = build_param_groups(tiny_llama(8), BASE, 0.9, wd)
    assert all(g["params"] for g in plan.groups)
    per_depth = {}
    for g in plan.groups:
        per_depth[g["depth"]] = per_depth.get(g["depth"], 0) + 1
    assert max(per_depth.values()) == (2 if wd else 1)
    assert len(plan.groups) <= 20
    assert len({g["name"] for g in plan.groups}) == len(plan.groups)
    if wd == 0:
        assert [g["name"] for g in plan.groups] == ["embeddings"] + [f"block_{i}" for i in range(8)] + ["head"]


def test_weight_decay_only_on_matrices_not_norms_or_biases():
    model = tiny_llama(2, attention_bias=True)
    plan = build_param_groups(model, BASE, 0.9, 0.1)
    named = dict(model.named_parameters())
    seen_decay = set()
    for g in plan.groups:
        for name in plan.param_names[g["name"]]:
            p = named[name]
            if g["weight_decay"] > 0:
                seen_decay.add(name)
                assert p.ndim >= 2 and "norm" not in name and "bias" not in name, name
                assert not g["name"].endswith(".no_decay")
            else:
                assert g["name"].endswith(".no_decay")
                assert p.ndim < 2 or "norm" in name or "bias" in name, name
    assert "model.embed_tokens.weight" in seen_decay  # embedding matrices decay, as in HF Trainer
    assert "model.layers.0.self_attn.q_proj.weight" in seen_decay
    assert all(r["weight_decay"] == 0.1 for r in plan.rows)


def test_one_dimensional_parameters_never_decay_whatever_their_name():
    model = Toy(2)
    model.layers[0].register_parameter("gain", nn.Parameter(torch.ones(8)))
    plan = build_param_groups(model, BASE, 0.9, 0.1)
    assert "layers.0.gain" in plan.param_names["block_0.no_decay"]
    assert "layers.0.proj.weight" in plan.param_names["block_0"]


def test_min_scale_clamps_the_lowest_depths():
    plan = build_param_groups(Toy(6), BASE, 0.5, min_scale=0.1)
    scales = {r["block"]: r["scale"] for r in plan.rows}
    assert scales["embeddings"] == scales["block_0"] == scales["block_1"] == 0.1  # 0.5^5, 0.5^5, 0.5^4
    assert scales["block_2"] == 0.125 and scales["block_3"] == 0.25 and scales["block_5"] == scales["head"] == 1.0
    assert plan.lr_of("embed.weight") == pytest.approx(BASE * 0.1)
    assert "block_0 LR=1e-04" in summary_line(plan)


def test_freeze_below_freezes_and_saves_exactly_the_adam_state_bytes():
    torch.manual_seed(0)
    ref, frozen_model = Toy(6), Toy(6)
    frozen_model.load_state_dict(ref.state_dict())
    full = build_param_groups(ref, BASE, 0.5)
    plan = build_param_groups(frozen_model, BASE, 0.5, freeze_below=0.2)  # scales 1/32, 1/16, 1/8 frozen
    assert all(p.requires_grad for p in frozen_model.parameters())  # planning changes nothing
    assert apply_freeze(plan) == len(plan.frozen_param_names) > 0
    assert all(not p.requires_grad for n, p in frozen_model.named_parameters() if n in plan.frozen_param_names)
    assert all(p.requires_grad for n, p in frozen_model.named_parameters() if n not in plan.frozen_param_names)
    assert {n for n in plan.frozen_param_names} == {
        n for n, _ in frozen_model.named_parameters() if expected_scale(n, 6, 0.5) < 0.2
    }
    grouped = {n for names in plan.param_names.values() for n in names}
    assert not grouped & set(plan.frozen_param_names)
    assert all(g["scale"] >= 0.2 for g in plan.groups)
    frozen_rows = [r["block"] for r in plan.rows if r["frozen"]]
    assert frozen_rows == ["embeddings", "block_0", "block_1", "block_2"]
    assert all(not r["trainable"] and r["n_params"] > 0 for r in plan.rows if r["frozen"])
    saved = adam_state_bytes(one_step(ref, full.groups)) - adam_state_bytes(one_step(frozen_model, plan.groups))
    assert saved == plan.frozen_state_bytes_saved > 0


def test_tiny_lowest_scale_warns_unless_clamped_or_frozen():
    plan = build_param_groups(Toy(32), BASE, 0.5)
    assert any("minimum scale" in w and "freezing" in w for w in plan.warnings)
    assert not build_param_groups(Toy(32), BASE, 0.5, min_scale=0.01).warnings
    assert not build_param_groups(Toy(32), BASE, 0.9).warnings  # 0.9^31 = 0.038


def test_unresolvable_model_raises_with_unmatched_names_and_fix():
    model = Toy(4, list_name="stack", config=False)  # no config, no known block-list name
    with pytest.raises(BlockStructureError) as exc:
        build_param_groups(model, BASE, 0.9)
    msg = str(exc.value)
    assert "Toy" in msg and "embed.weight" in msg and "stack.0.proj.weight" in msg and "more" in msg
    assert "stack (4)" in msg
    assert isinstance(exc.value, ValueError) and exc.value.candidates == [("stack", 4)]
    assert "--" not in msg and "recipe" not in msg  # the library speaks no CLI


def test_config_count_mismatch_is_not_silently_accepted():
    model = Toy(4)
    model.config.num_hidden_layers = 5
    with pytest.raises(BlockStructureError, match=r"N = 5 blocks.*layers \(4\)"):
        build_param_groups(model, BASE, 0.9)


def test_explicit_block_path_with_a_different_length_than_the_config_warns_and_uses_the_list():
    model = Toy(4)
    model.config.num_hidden_layers = 5
    plan = build_param_groups(model, BASE, 0.5, block_path="layers")
    assert plan.num_layers == 4 and any("config says 5" in w for w in plan.warnings)


@pytest.mark.parametrize("kwargs", [{"min_scale": 0.1}, {"freeze_below": 0.1}])
def test_unresolvable_model_raises_for_clamp_or_freeze_even_at_gamma_one(kwargs):
    with pytest.raises(BlockStructureError):
        build_param_groups(Toy(4, list_name="stack", config=False), BASE, 1.0, **kwargs)


def test_gamma_one_on_unresolvable_model_gives_flat_groups_with_warning():
    model = Toy(4, list_name="stack", config=False)
    plan = build_param_groups(model, BASE, 1.0, 0.1)
    assert not plan.structure_found and plan.block_path is None
    assert [g["name"] for g in plan.groups] == ["all", "all.no_decay"]
    assert all(g["lr"] == BASE for g in plan.groups)
    assert {n for v in plan.param_names.values() for n in v} == {n for n, _ in model.named_parameters()}
    assert any("not resolved" in w for w in plan.warnings)
    assert len(plan.rows) == 1 and plan.rows[0]["block"] == "all"
    assert [g["name"] for g in build_param_groups(model, BASE, 1.0).groups] == ["all"]


def test_block_path_override_resolves_a_custom_list():
    model = Toy(4, list_name="stack", config=False)
    path, blocks = find_block_list(model, "stack")
    assert path == "stack" and blocks is model.stack
    plan = build_param_groups(model, BASE, 0.5, block_path="stack")
    assert plan.block_path == "stack" and plan.num_layers == 4
    for name, lr in lr_by_param(plan).items():
        assert lr == pytest.approx(BASE * expected_scale(name, 4, 0.5)), name


def test_block_path_matches_after_stripping_wrapper_prefixes():
    inner = Toy(4, list_name="stack", config=False)
    wrapper = nn.Module()
    wrapper._orig_mod = inner
    path, blocks = find_block_list(wrapper, "stack")
    assert path == "_orig_mod.stack" and blocks is inner.stack


def test_block_path_and_lr_of_see_through_a_wrapper_in_the_middle_of_the_path():
    model = tiny_llama(4)
    expected = lr_by_param(build_param_groups(model, BASE, 0.5))
    shell = nn.Module()
    shell._fsdp_wrapped_module = model.model
    model.model = shell  # parameters now live under model._fsdp_wrapped_module.*
    plan = build_param_groups(model, BASE, 0.5, block_path="model.layers")
    assert plan.block_path == "model._fsdp_wrapped_module.layers"
    assert plan.lr_of("model.layers.2.mlp.up_proj.weight") == BASE * 0.5
    got = lr_by_param(plan)
    assert {n.replace("._fsdp_wrapped_module", ""): lr for n, lr in got.items()} == expected


@pytest.mark.parametrize("bad", ["norm", "nope.layers", "layers.0"])
def test_bad_block_path_raises_value_error_listing_candidates(bad):
    with pytest.raises(ValueError, match=r"layers \(4\)") as exc:
        build_param_groups(Toy(4), BASE, 0.9, block_path=bad)
    assert bad in str(exc.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"gamma": 0.0},
        {"gamma": -0.5},
        {"gamma": 1.01},
        {"gamma": float("nan")},
        {"gamma": "0.9"},
        {"base_lr": 0.0},
        {"base_lr": float("inf")},
        {"weight_decay": -0.1},
        {"min_scale": 1.5},
        {"freeze_below": -0.1},
        {"tied_policy": "both"},
    ],
)
def test_bad_arguments_raise_value_error(kwargs):
    args = {"base_lr": BASE, "gamma": 0.9, **kwargs}
    with pytest.raises(ValueError):
        build_param_groups(Toy(2), **args)


@pytest.mark.parametrize("gamma", [0.1, 0.3, 0.49])
def test_library_accepts_any_gamma_in_zero_one_beyond_the_cli_range(gamma):
    plan = build_param_groups(Toy(3), BASE, gamma)
    assert plan.lr_of("block_0") == pytest.approx(BASE * gamma**2, rel=1e-12)


@pytest.mark.parametrize("policy", TIED_POLICIES)
def test_tied_matrix_follows_the_tied_policy(policy):
    model = Toy(4, tie=True)
    plan = build_param_groups(model, BASE, 0.5, tied_policy=policy)
    want = BASE * 0.5**3 if policy == "embedding" else BASE
    assert plan.tied and plan.tied_param_name == "embed.weight" and plan.tied_policy == policy
    assert plan.tied_lr == pytest.approx(want) and plan.lr_of("embed.weight") == pytest.approx(want)
    assert [r["block"] for r in plan.rows if r["tied"]] == ["embeddings" if policy == "embedding" else "head"]
    assert DEFAULT_TIED_POLICY == "embedding"
    assert not build_param_groups(Toy(4), BASE, 0.5).tied


def test_works_through_torch_compile_orig_mod_wrapper():
    model = tiny_llama(4)
    expected = lr_by_param(build_param_groups(model, BASE, 0.5))
    compiled = torch.compile(model)  # not run: only the `_orig_mod.` prefix matters
    plan = build_param_groups(compiled, BASE, 0.5, 0.1)
    assert plan.block_path == "_orig_mod.model.layers"
    got = lr_by_param(plan)
    assert all(n.startswith("_orig_mod.") for n in got)
    assert {n.removeprefix("_orig_mod."): lr for n, lr in got.items()} == expected


def test_works_with_checkpoint_wrapped_blocks():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    model = tiny_llama(4)
    expected = lr_by_param(build_param_groups(model, BASE, 0.5))
    for i, layer in enumerate(model.model.layers):
        model.model.layers[i] = checkpoint_wrapper(layer)
    got = lr_by_param(build_param_groups(model, BASE, 0.5))
    assert any("_checkpoint_wrapped_module" in n for n in got)
    assert {n.replace("._checkpoint_wrapped_module", ""): lr for n, lr in got.items()} == expected


@pytest.mark.parametrize("attr", ["_fsdp_wrapped_module", "module"])
def test_works_through_fsdp_and_ddp_style_prefixes(attr):
    inner = Toy(4)
    wrapper = nn.Module()
    setattr(wrapper, attr, inner)
    plan = build_param_groups(wrapper, BASE, 0.5)
    assert plan.block_path == f"{attr}.layers"
    for name, lr in lr_by_param(plan).items():
        assert lr == pytest.approx(BASE * expected_scale(name.removeprefix(attr + "."), 4, 0.5)), name


def test_lambda_lr_scheduler_keeps_per_group_ratios():
    model = Toy(4)
    plan = build_param_groups(model, BASE, 0.5, 0.1)
    opt = torch.optim.AdamW(plan.groups, lr=BASE)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    for _ in range(5):
        opt.step()
        sched.step()
    for g in opt.param_groups:
        assert g["lr"] == pytest.approx(BASE * g["scale"] / 6, rel=1e-12)
        assert g["lr"] / opt.param_groups[-1]["lr"] == pytest.approx(g["scale"], rel=1e-12)


def test_first_adamw_step_moves_each_param_by_its_group_lr():
    torch.manual_seed(0)
    model = Toy(4)
    plan = build_param_groups(model, BASE, 0.5)
    before = {id(p): p.detach().clone() for p in model.parameters()}
    opt = one_step(model, plan.groups, eps=1e-12)
    for g in opt.param_groups:
        for p in g["params"]:
            mask = p.grad.abs() > 1e-7
            assert mask.any()
            delta = (p.detach() - before[id(p)])[mask]
            torch.testing.assert_close(delta, -g["lr"] * p.grad.sign()[mask], rtol=1e-3, atol=1e-9)


def test_json_and_summary_line():
    plan = build_param_groups(Toy(4), 3e-5, 0.95, 0.1)
    data = plan.to_json()
    assert [d["name"] for d in data] == [g["name"] for g in plan.groups]
    assert set(data[0]) == {
        "name",
        "lr",
        "weight_decay",
        "scale",
        "depth",
        "depth_scale",
        "pattern",
        "factor",
        "loraplus",
        "params",
    }
    assert all(isinstance(n, str) for d in data for n in d["params"])
    assert summary_line(plan) == "γ=0.95 → block_0 LR=2.57e-05, head LR=3e-05"
    assert plan.lr_of("block_3") == 3e-5
    with pytest.raises(KeyError):
        plan.lr_of("no.such.param")


def test_80_block_meta_model_builds_groups_fast():
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(
        vocab_size=128256,
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
    )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        plan = build_param_groups(model, 1e-4, 0.95, 0.1)
        best = min(best, time.perf_counter() - start)
    assert best < 0.5
    assert plan.num_layers == 80 and len(plan.groups) == 2 * 82 - 1  # embeddings has no no_decay tensor
    assert not plan.tied  # meta tensors all have data_ptr 0: must not be mistaken for tying


def test_llrd_module_does_not_import_hf_libraries():
    code = (
        "import sys, posttrainllm.llrd; "
        "bad = [m for m in ('transformers', 'trl', 'peft', 'datasets') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ------------------------------------------------------------------- structured errors: the field, not the words
def _tiny_blocks_model():
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
            self.head = nn.Linear(4, 10)

    return Tiny()


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"lr_groups": {"nothing_is_called_this": 0.5}}, "lr_groups"),
        ({"lr_groups": {"(": 0.5}}, "lr_groups"),
        ({"lr_groups": {"layers": -1.0}}, "lr_groups"),
        ({"loraplus_ratio": 4.0}, "loraplus_ratio"),
        ({"loraplus_ratio": float("nan")}, "loraplus_ratio"),
        ({"block_path": "no.such.list"}, "block_path"),
        ({"gamma": 0.0}, "gamma"),
        ({"min_scale": 2.0}, "min_scale"),
    ],
)
def test_a_bad_argument_raises_an_error_carrying_its_field(kwargs, field):
    from posttrainllm import LLRDArgumentError

    with pytest.raises(LLRDArgumentError) as exc:
        build_param_groups(_tiny_blocks_model(), 1e-3, **kwargs)
    assert isinstance(exc.value, ValueError) and exc.value.field == field and field in exc.value.fields


def test_several_bad_arguments_are_reported_at_once_with_every_field():
    from posttrainllm import LLRDArgumentError

    with pytest.raises(LLRDArgumentError) as exc:
        build_param_groups(_tiny_blocks_model(), -1.0, gamma=2.0, loraplus_ratio=0.0)
    assert exc.value.fields == ("gamma", "base_lr", "loraplus_ratio")
    assert "gamma must be in (0, 1]" in str(exc.value) and "loraplus_ratio must be" in str(exc.value)


@pytest.mark.parametrize(
    "field,flag",
    [("lr_groups", "--lr-group"), ("block_path", "--llrd-blocks"), ("loraplus_ratio", "--loraplus-ratio")],
)
def test_the_cli_names_the_flag_from_the_errors_field_whatever_its_words(field, flag, monkeypatch):
    """A reworded library message (none of the words the CLI once looked for) still blames the right flag."""
    from posttrainllm import llrd, planning
    from posttrainllm.commands.registry import resolve
    from posttrainllm.errors import UsageError

    def reworded(*a, **k):
        raise llrd.LLRDArgumentError(field, "this argument is not acceptable")

    monkeypatch.setattr(llrd, "build_param_groups", reworded)
    cfg = resolve("sft", {"model": "org/m", "dataset": "org/d", "output_dir": "o"})
    with pytest.raises(UsageError) as exc:
        planning.plan_param_groups(cfg, _tiny_blocks_model())
    assert str(exc.value) == f"{flag}: this argument is not acceptable"
