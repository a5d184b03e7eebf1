"""Vision-language models (docs/vlm.md): telling one from its config (`detect`), and image-text data for sft and dpo
(`data`: the rows TRL's vision collators take, images opened as each batch is built). Importing the package is
cheap: `transformers` and `datasets` are imported inside the functions."""
