"""One module per command, each with `main(cfg)`: what the command needs (its models, its data shape, its banner
rows) and nothing else; the shared run lives in posttrainllm/lifecycle.py. The CLI (posttrainllm/cli.py) calls
`posttrainllm.commands.<command>.main` with the resolved config."""
