"""Where a model or dataset reference points: a local path, a Hugging Face Hub id, or a special file (a FIFO, a
socket, a device) that must not be opened. Imports nothing heavy."""

from __future__ import annotations

import errno
import os
import re
import stat

# Names that look like a file (a data, config or weights extension) are never taken for a Hub id.
_FILE_LIKE = re.compile(
    r"\.(json|jsonl|ndjson|csv|tsv|parquet|txt|arrow|gz|zip|bz2|xz|zst|md|text|yaml|yml|safetensors|bin)$", re.I
)
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9][A-Za-z0-9_.\-]*)?$")


def looks_local(ref: str) -> bool:
    """A reference the user means as a local path: it exists, or it can only be a path (./x, /x, ~/x, a/b/c,
    a\\b, a file name like data.jsonl). `owner/name` and `name` are Hub ids unless such a path exists."""
    if os.path.exists(os.path.expanduser(ref)):
        return True
    if ref.startswith((".", "/", "~")) or "\\" in ref or ref.count("/") > 1:
        return True
    return bool(_FILE_LIKE.search(ref))


def looks_like_hub_id(ref: str) -> bool:
    """`owner/name` or `name` that is not a local path."""
    return not looks_local(ref) and bool(_HUB_ID.match(ref))


def not_a_file(path: str | os.PathLike) -> str:
    """What a path that is no regular file is, for a message: "not found", "is a symlink loop", "is a symlink to a
    missing file", "is a directory", "is a FIFO (named pipe)"... Only its mode is read (a FIFO is never opened)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "is a symlink loop"
        return "is a symlink to a missing file" if os.path.islink(path) else "not found"
    if stat.S_ISDIR(mode):
        return "is a directory"
    return f"is {special_file(str(path)) or 'not a regular file'}"


def special_file(path: str) -> str | None:
    """What a path is when it exists but is neither a regular file nor a directory (reading it could block forever
    or never end), else None. Checked before anything opens it."""
    try:
        mode = os.stat(os.path.expanduser(path)).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    kinds = (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    return next((kind for test, kind in kinds if test(mode)), "not a regular file")
