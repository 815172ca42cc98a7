"""Which host (and which boot of it) a process runs on: equal ids mean a node's /dev/shm arena is mappable.

machine-id alone is not enough: containers often share it with the host while having their own /dev/shm, and a
rebooted machine has a fresh /dev/shm. So the id is machine-id + boot id + the device of /dev/shm,
(st_dev of its tmpfs mount) differs between containers that do not share /dev/shm. A client still checks that the
advertised arena file exists and has the advertised size before it maps it.
"""

from __future__ import annotations

import functools
import os
import socket

import xxhash


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


@functools.cache
def host_id(shm_dir: str = "/dev/shm") -> str:
    try:
        st = os.stat(shm_dir)
        shm = str(st.st_dev)
    except OSError:
        shm = ""
    machine = _read("/etc/machine-id") or _read("/var/lib/dbus/machine-id") or socket.gethostname()
    boot = _read("/proc/sys/kernel/random/boot_id")
    return xxhash.xxh3_64_hexdigest(f"{machine}|{boot}|{shm}".encode())
