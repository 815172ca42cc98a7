"""Huge pages for the DRAM arena: `huge_pages(directory)` names the mount that gives them, and on real tmpfs mounts
the arena's pages are 2 MiB exactly where it says so (the kernel's own count for the arena's mapping)."""

from __future__ import annotations

import contextlib
import re
import subprocess

import pytest

from kvpool.tiers.dram import DramArena, huge_pages

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
23 22 0:21 / /dev/shm rw,nosuid,nodev shared:2 - tmpfs tmpfs rw,size=24684084k
30 22 0:30 / /mnt/h rw,relatime shared:9 - tmpfs tmpfs rw,size=8388608k,huge=within_size
31 30 8:2 / /mnt/h/disk rw,relatime shared:10 - ext4 /dev/vdb rw
32 22 0:31 / /mnt/s rw,relatime shared:11 - tmpfs tmpfs rw,huge=always
33 32 0:32 / /mnt/s rw,relatime shared:12 - tmpfs tmpfs rw,huge=never
34 22 0:33 / /mnt/a\\040b rw,relatime shared:13 - tmpfs tmpfs rw,huge=always
35 22 0:34 / /mnt/adv rw,relatime shared:14 - tmpfs tmpfs rw,huge=advise
36 22 0:35 / /mnt/tlb rw,relatime shared:15 - hugetlbfs none rw,pagesize=2M
37 22 0:36 / /mnt/hx rw,relatime shared:16 - tmpfs tmpfs rw,huge=always
garbage line without the separator
"""
NEVER = "always within_size advise [never] deny force"


@pytest.mark.parametrize("directory, expected", [
    ("/dev/shm", None),                          # no huge= option: never
    ("/mnt/h", "tmpfs huge=within_size"),
    ("/mnt/h/arenas", "tmpfs huge=within_size"),  # a directory below the mount point
    ("/mnt/h/disk", None),                       # a mount inside it: the longest mount point decides
    ("/mnt/hx", "tmpfs huge=always"),            # /mnt/h is not a path prefix of /mnt/hx
    ("/mnt/s", None),                            # stacked mounts: the last one listed is on top
    ("/mnt/a b/x", "tmpfs huge=always"),         # a mount point with an escaped space
    ("/mnt/adv", None),                          # advise: fallocate reserves base pages there
    ("/mnt/tlb", "hugetlbfs"),
    ("/srv", None),                              # ext4
])
def test_huge_pages_names_the_mount_that_gives_them(directory, expected):
    assert huge_pages(directory, mountinfo=MOUNTINFO, shmem_enabled=NEVER) == expected


def test_shmem_enabled_deny_and_force_override_every_tmpfs():
    deny = "always within_size advise never [deny] force"
    force = "always within_size advise never deny [force]"
    assert huge_pages("/mnt/h", mountinfo=MOUNTINFO, shmem_enabled=deny) is None
    assert huge_pages("/dev/shm", mountinfo=MOUNTINFO, shmem_enabled=force) == "tmpfs (shmem_enabled force)"
    assert huge_pages("/mnt/tlb", mountinfo=MOUNTINFO, shmem_enabled=deny) == "hugetlbfs"   # not THP: untouched
    assert huge_pages("/anything", mountinfo="", shmem_enabled="") is None


@contextlib.contextmanager
def _tmpfs(path, huge: str):
    path.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"huge={huge},size=64m", "tmpfs", str(path)],
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {res.stderr.strip()}")
    try:
        yield str(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def _pmd_mapped_kb(address: int) -> int:
    """ShmemPmdMapped of this process's mapping that starts at `address`: its bytes mapped as 2 MiB pages."""
    with open("/proc/self/smaps") as f:
        blocks = re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", f.read())
    for block in blocks:
        if int(block.split("-", 1)[0], 16) == address:
            return int(re.search(r"^ShmemPmdMapped:\s+(\d+) kB", block, re.MULTILINE).group(1))
    raise AssertionError(f"no mapping starts at {address:#x}")


@pytest.mark.parametrize("huge, expected, pmd_kb", [
    ("within_size", "tmpfs huge=within_size", 8192),
    ("always", "tmpfs huge=always", 8192),
    ("advise", None, 0),
    ("never", None, 0),
])
def test_an_arena_on_a_real_tmpfs_gets_2mib_pages_where_huge_pages_says(tmp_path, huge, expected, pmd_kb):
    with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
        mode = re.search(r"\[(\w+)\]", f.read())
    if mode is None or mode.group(1) in ("force", "deny"):
        pytest.skip(f"shmem_enabled {mode and mode.group(1)!r} overrides every tmpfs mount's huge= (or no THP)")
    with _tmpfs(tmp_path / "mnt", huge) as directory:
        arena = DramArena.create(8 << 20, name="huge", directory=directory)
        try:
            arena.array(0, arena.capacity)[:] = 7          # map every page in this process
            assert arena.huge_pages == expected
            assert _pmd_mapped_kb(arena.address) == pmd_kb
            assert bytes(arena.view(arena.capacity - 3, 3)) == b"\x07\x07\x07"
        finally:
            arena.close()
            arena.unlink()


@pytest.mark.parametrize("huge, expected", [("within_size", "2 MiB pages, tmpfs huge=within_size"),
                                            ("never", "base pages")])
def test_a_node_says_what_pages_its_arena_got_when_it_registers(tmp_path, huge, expected):
    """NodeInfo.dram_pages (the endpoint's, `kvpool nodes`): the node's arena on a real mount made here."""
    from kvpool.store.config import NodeConfig
    from kvpool.store.node import StorageNode

    with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
        mode = re.search(r"\[(\w+)\]", f.read())
    if mode is None or mode.group(1) in ("force", "deny"):
        pytest.skip(f"shmem_enabled {mode and mode.group(1)!r} overrides every tmpfs mount's huge= (or no THP)")
    with _tmpfs(tmp_path / "mnt", huge) as directory:
        node = StorageNode(NodeConfig(node_id="n1", dram_bytes=8 << 20, shm_dir=directory))
        try:
            assert node.info().dram_pages == expected
        finally:
            node.close()
    ssd_only = StorageNode(NodeConfig(node_id="n2", dram_bytes=0, ssd_path=str(tmp_path / "ssd"), ssd_bytes=1 << 20))
    try:
        assert ssd_only.info().dram_pages == ""           # no DRAM tier: nothing to say
    finally:
        ssd_only.close()
