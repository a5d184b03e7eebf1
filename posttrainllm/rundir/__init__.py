"""The run directory: its file layout (a leaf), ownership and lock, checkpoints, and signals.

- `layout`: file names, `is_rank0` / `world_size`, `write_json`, checkpoint listing and verification, the newest
  good checkpoint. It imports nothing from the project but `errors`, so every other room can use it.
- `outdir`: what posttrainllm may write, replace and remove in the user's directory, and the lock.
- `checkpoints`: resume checks, the run config record, the atomic final save.
- `signals`: SIGTERM/SIGINT → checkpoint and stop, and the COMPLETE marker callback.
"""
