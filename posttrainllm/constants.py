"""Constants shared by the torch-free config layer and the torch-only library (importing this module is free)."""

TIED_POLICIES = ("embedding", "head")  # what LR a tied input/output embedding matrix gets
DEFAULT_TIED_POLICY = "embedding"  # measured on SmolLM2-135M: docs/decision_log.md entry 43 (entry 14: toy bases)
LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers")  # a config's block count, first found wins
DEFAULT_WINDOW = 512  # eval's default --max-length, and the window of a run's held-out text when it has none
