"""merge's --alpha values: each names its own alpha-A/ folder (six significant digits), or the merge refuses."""

from types import SimpleNamespace

import pytest

from posttrainllm.commands.merge import alpha_folder, config_problems


def _cfg(alphas):
    return SimpleNamespace(
        alpha=alphas,
        depth_schedule="geometric",
        bottom_alpha=None,
        llrd=1.0,
        llrd_bottom_scale=0.0,
        discard_weights=False,
        eval_dataset=None,
        ood_eval=[],
    )


@pytest.mark.parametrize(("a", "b"), [(0.5, 0.5000001), (0.1, 0.10000001), (1.0, 0.9999999)])
def test_values_that_name_one_folder_are_refused_naming_both(a, b):
    assert alpha_folder(a) == alpha_folder(b)
    problems = config_problems(_cfg([a, 0.25, b]))
    assert len(problems) == 1
    assert "--alpha" in problems[0] and repr(a) in problems[0] and repr(b) in problems[0]
    assert alpha_folder(a) + "/" in problems[0]


def test_distinct_folders_pass_and_a_repeated_value_is_reported_once():
    assert config_problems(_cfg([0.25, 0.5, 0.500001, 1.0])) == []
    assert config_problems(_cfg([0.5, 0.5])) == ["--alpha 0.5 given more than once"]
