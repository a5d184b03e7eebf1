"""One module per command, each with its `SPEC` (posttrainllm/spec.py: what the command is, as data); a command that
trains nothing has its `main(cfg)` too. Beside them, a command's own parts (`post_training.py`: the setup the
post-training commands share; `demo_data.py`: the demo's data). `registry.py` lists the specs. The CLI
(posttrainllm/cli.py) registers the commands from the registry and runs a training command through the one shared
`posttrainllm.lifecycle.main(cfg, spec)`, which runs the spec's `setup`; any other command through its module's
`main`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig

POST_TRAINING_SETUP = "posttrainllm.commands.post_training:setup"  # the setup the post-training commands share


def num_proc(cfg: RunConfig) -> int | None:
    """--dataset-num-proc for TRL's tokenization map (None: in this process)."""
    n = cfg.dataset_num_proc or 1
    return n if n > 1 else None


def default_reference(cfg: RunConfig) -> str:
    """The banner's reference model when --ref-model is not given."""
    return "adapter-disabled base" if cfg.lora_r else "frozen copy of --model"
