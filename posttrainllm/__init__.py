"""posttrainllm: LLM post-training with layer-wise learning-rate decay."""

__version__ = "0.1.0"
