"""The processor probes (posttrainllm/vision/probe.py) on the tiny families of tests/vlm_models.py: the template's
assistant mask covers the reply and the processor takes text alone for every family but PaliGemma, whose processor
inserts a BOS after the image tokens and wants images with every text; and missing_backends reads an ImportError
of transformers' requires_backends from its frames."""

import pytest
from vlm_models import BUILDERS, TRAINED

from posttrainllm.vision.probe import assistant_mask_problem, text_alone_problem


@pytest.mark.parametrize("family", TRAINED)
def test_the_probes_pass_where_trl_collates_the_family(family):
    _, processor = BUILDERS[family]()
    assert assistant_mask_problem(processor) is None
    assert text_alone_problem(processor) is None


def test_paligemmas_processor_fails_both_probes_saying_why():
    _, processor = BUILDERS["paligemma"]()
    mask = assistant_mask_problem(processor)
    assert mask is not None and "not on the reply" in mask and "\n" not in mask.replace("\\n", "")
    alone = text_alone_problem(processor)
    assert alone is not None and alone.startswith("PaliGemmaProcessor takes no text without images")


def test_mllamas_processor_shifts_the_assistant_mask_but_takes_text_alone():
    _, processor = BUILDERS["mllama"]()
    mask = assistant_mask_problem(processor)
    assert mask is not None and "not on the reply" in mask
    assert text_alone_problem(processor) is None


def test_missing_backends_names_the_class_and_the_uninstalled_package():
    from transformers.utils.import_utils import BACKENDS_MAPPING, requires_backends

    from posttrainllm.models import missing_backends

    absent = next((b for b, (available, _) in BACKENDS_MAPPING.items() if not available()), None)
    if absent is None:
        pytest.skip("every optional backend transformers knows is installed")

    class Part:
        pass

    with pytest.raises(ImportError) as e:
        requires_backends(Part, ["torch", absent])
    name, packages = missing_backends(e.value)
    assert name == "Part" and len(packages) == 1 and packages[0] != "torch"
    assert missing_backends(ImportError("No module named x")) is None
