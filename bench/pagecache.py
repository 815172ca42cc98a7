"""Drop a file from the page cache, so the next read of it comes from the disk (bench/e2e.py, bench/vllm_e2e.py and
bench/ssd_read.py time SSD reads after it)."""

from __future__ import annotations

import os


def drop_page_cache(path) -> None:
    """fsync, then ask the kernel to drop the file's pages (clean pages go; a dirty one would stay: hence fsync)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
