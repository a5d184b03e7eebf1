"""One module per command, each with its `SPEC` (posttrainllm/spec.py: what the command is, as data); a command that
trains nothing has its `main(cfg)` too. Beside them, a command's own parts (`post_training.py`: the setup the
post-training commands share; `demo_data.py`: the demo's data). `registry.py` lists the specs. The CLI
(posttrainllm/cli.py) registers the commands from the registry and runs a training command through the one shared
`posttrainllm.lifecycle.main(cfg, spec)`, which runs the spec's `setup`; any other command through its module's
`main`."""

POST_TRAINING_SETUP = "posttrainllm.commands.post_training:setup"  # the setup the post-training commands share
