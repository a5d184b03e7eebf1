"""Pages of memory-mapped Arrow data given back once read (decision log entry 31)."""

from __future__ import annotations

import os


def release(table) -> None:
    """Drop the pages of a memory-mapped Arrow table (or batch) that has been read from this process's memory.

    datasets memory-maps its Arrow files; every page a pass reads stays mapped into the process, so its RSS grows
    with the dataset although those are clean page-cache pages. After a batch is processed, madvise(MADV_DONTNEED)
    unmaps the pages of its buffers that lie in a read-only file mapping: they stay in the page cache (a later
    read maps them again, from memory) and nothing else is touched (heap memory is never advised). Linux only; a
    no-op elsewhere or on any error.
    """
    advise = _madvise()
    if advise is None or table is None:
        return
    try:
        columns = table.columns if hasattr(table, "columns") else [table]
        ranges = []
        for column in columns:
            for chunk in getattr(column, "chunks", [column]):
                ranges += [(b.address, b.address + b.size) for b in chunk.buffers() if b is not None and b.size]
        _advise_file_pages(ranges, advise)
    except Exception:  # noqa: BLE001 - only a hint
        pass


_MAPS: list = []  # sorted (start, end) of the read-only file mappings seen in /proc/self/maps
_MADVISE: list = []


def _madvise():
    if not _MADVISE:
        fn = None
        if os.name == "posix" and os.uname().sysname == "Linux" and os.path.exists("/proc/self/maps"):
            try:
                import ctypes

                libc = ctypes.CDLL(None, use_errno=True)
                fn = libc.madvise
                fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                fn.restype = ctypes.c_int
            except (OSError, AttributeError):
                fn = None
        _MADVISE.append(fn)
    return _MADVISE[0]


def _read_only_file_maps() -> list:
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[1].startswith("r-") and parts[5].startswith("/"):
                start, end = parts[0].split("-")
                out.append((int(start, 16), int(end, 16)))
    return sorted(out)


def _advise_file_pages(ranges, advise) -> None:
    import bisect
    import mmap

    page = mmap.PAGESIZE
    refreshed = False
    for lo, hi in ranges:
        if hi - lo < 4 * page:
            continue
        for attempt in range(2):
            i = bisect.bisect_right(_MAPS, (lo, float("inf"))) - 1
            if i >= 0 and _MAPS[i][0] <= lo and hi <= _MAPS[i][1]:
                break
            if refreshed or attempt:
                i = -1
                break
            _MAPS[:] = _read_only_file_maps()
            refreshed = True
        if i < 0:
            continue  # not (wholly) in a read-only file mapping: leave it alone
        start = (lo + page - 1) // page * page
        end = hi // page * page
        if end > start:
            advise(start, end - start, 4)  # MADV_DONTNEED
