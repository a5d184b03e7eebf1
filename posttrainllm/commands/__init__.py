"""One module per command, each with its `SPEC` (posttrainllm/commands/spec.py: what the command is, as data) and
`main(cfg)`; beside them, a command's own parts (`post_training.py`: the setup the post-training commands share;
`demo_data.py`: the demo's data). `registry.py` lists the specs. The shared run lives in posttrainllm/lifecycle.py and
reads the spec its command hands it. The CLI (posttrainllm/cli.py) registers the commands from the registry and calls
`posttrainllm.commands.<command>.main` with the resolved config."""
