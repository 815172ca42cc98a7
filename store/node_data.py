"""A storage node's bytes as its data paths see them: `NodeDataHandler`, the token-checked access to the node's tiers
that the raw TCP data channel (store/data_channel.py) and NodeService's gRPC Write / Read (store/node_server.py)
serve. A write must carry a grant signed with the registration's write key (or the pool's secret, from a master
before 2026-12-07) and lands only while its grant holds (`write_fence`, store/write_fence.py); a read carries a
lease signed with the pool's secret. DRAM extents are views of the arena; SSD records and HBM extents are staged in
a per-thread buffer, SSD records verified there; an SSD record for a client that checks the payload itself
(FLAG_CHECKED) has only its header checked and is sent from the data file (FileSpan, os.sendfile)."""

from __future__ import annotations

import threading
from typing import Sequence

from kvpool.store import tokens
from kvpool.store.data_channel import Extent, FileSpan
from kvpool.store.node import StorageNode
from kvpool.store.tokens import TokenError
from kvpool.store.write_fence import WriteFence
from kvpool.tiers.types import Tier

_SCRATCH_MAX = 8 << 20   # largest SSD/HBM read staged in a kept per-thread buffer


class NodeDataHandler:
    """Token-checked access to the node's tiers for the data channel and the gRPC data path."""

    def __init__(self, node: StorageNode) -> None:
        self.node = node
        self.secret: bytes | None = None  # set at registration; until then every request is refused
        self.write_key = b""    # write grants' key (RegisterNodeResponse.write_key, store/tokens.py); b"": `secret`
        self.write_fence = WriteFence()  # writes in flight: cut at their deadline and before a registration
        self._scratch = threading.local()  # per serving thread: the buffer SSD/HBM reads are staged in
        self._lock = threading.Lock()       # _file_reads
        self._file_reads = 0

    def _verify(self, kind: bytes, e: Extent) -> None:
        secret = self.secret
        if secret is None:
            raise TokenError("token: node is not registered with a master yet")
        secret = self.write_key if kind == tokens.WRITE and self.write_key else secret
        tokens.verify(secret, kind, e.ident, e.tier, e.offset, e.size, e.expires_ms, e.token)

    def write_view(self, e: Extent) -> memoryview:
        self._verify(tokens.WRITE, e)
        if e.tier == Tier.DRAM and self.node.dram is not None:
            return self.node.dram.view(e.offset, e.size)
        if (e.tier == Tier.SSD and self.node.ssd is not None) or (e.tier == Tier.HBM and self.node.hbm is not None):
            # staged: an SSD record is written whole, header last; HBM takes one host -> device copy
            return memoryview(bytearray(e.size))
        raise ValueError(f"tier: {e.tier} is not a tier of node {self.node.node_id}")

    def write_done(self, e: Extent, view: memoryview) -> None:
        """A staged write (SSD, HBM) lands only now: its token is checked again (expired, or stale: store/tokens.py)."""
        if e.tier in (Tier.SSD, Tier.HBM):
            self._verify(tokens.WRITE, e)
        if e.tier == Tier.SSD:
            self.node.write(Tier.SSD, e.offset, e.key, e.ns, view, None)
        elif e.tier == Tier.HBM:
            self.node.hbm.write(e.offset, view)

    def removal_stamp(self) -> bytes:
        """The node's removal stamp (StorageNode.removal_stamp): the data channel's STAMP and READ_DATED."""
        return self.node.removal_stamp()

    def read_view(self, e: Extent) -> memoryview:
        """The extent's bytes (the gRPC Read path and single reads): `read_views` of one, its error raised."""
        view = self.read_views([e])[0]
        if isinstance(view, Exception):
            raise view
        return view

    def read_views(self, extents: list[Extent], checked: Sequence[int] = ()) -> list:
        """`read_view` of each extent (the exception it would raise in its place), all valid together until this
        thread's next read_views or read_view: the data channel answers a window of READs with one sendmsg. SSD
        records are read in one `read_ssd_many` (records side by side: one preadv, tiers/ssd.py) into slices of
        this thread's staging buffer, except those at the positions in `checked` (their client checks the payload
        against the committed checksum, store/data_channel.py FLAG_CHECKED): their headers are checked and their
        payloads answered as FileSpans of the data file, sent by the channel with os.sendfile, never read here."""
        out: list = [None] * len(extents)
        staged: list[int] = []          # SSD records and HBM extents: read into this thread's staging buffer
        node = self.node
        for i, e in enumerate(extents):
            try:
                self._verify(tokens.READ, e)
                if e.tier == Tier.DRAM and node.dram is not None:
                    out[i] = node.dram.view(e.offset, e.size)
                elif (e.tier == Tier.SSD and node.ssd is not None) or (e.tier == Tier.HBM and node.hbm is not None):
                    staged.append(i)
                else:
                    raise ValueError(f"tier: {e.tier} is not a tier of node {node.node_id}")
            except Exception as exc:  # noqa: BLE001 - each refusal is its own extent's reply
                out[i] = exc
        if staged and checked:
            staged = self._file_spans(extents, staged, set(checked), out)
        if staged:
            bufs = self._staging_many([extents[i].size for i in staged])
            records = [(i, b) for i, b in zip(staged, bufs) if extents[i].tier == Tier.SSD]
            for i, buf in zip(staged, bufs):
                if extents[i].tier == Tier.HBM:       # one host copy each
                    try:
                        node.hbm.read_into(extents[i].offset, buf)
                        out[i] = buf
                    except Exception as exc:  # noqa: BLE001
                        out[i] = exc
            if records:
                try:
                    oks = node.read_ssd_many([extents[i].offset for i, _ in records],
                                             [extents[i].key for i, _ in records],
                                             [extents[i].size for i, _ in records], [b for _, b in records])
                except ValueError:      # one extent is out of the file: each alone, for its own error
                    oks = []
                    for i, buf in records:
                        try:
                            oks.append(node.read_into(Tier.SSD, extents[i].offset, extents[i].key, extents[i].size,
                                                      buf))
                        except Exception as exc:  # noqa: BLE001
                            oks.append(exc)
                for (i, buf), ok in zip(records, oks):
                    out[i] = ok if isinstance(ok, Exception) else buf if ok else KeyError(
                        "checksum: SSD record failed verification (served as a miss)")
        return out

    def _file_spans(self, extents: list[Extent], staged: list[int], checked: set[int], out: list) -> list[int]:
        """FileSpans into `out` for the SSD records of `staged` in `checked` (their headers checked by
        `SsdFile.payload_offsets`; a bad one NOT_FOUND, as a failed verification); returns the rest of `staged`."""
        ssd = self.node.ssd
        spans = [i for i in staged if i in checked and extents[i].tier == Tier.SSD]
        if not spans:
            return staged
        try:
            found = ssd.payload_offsets([extents[i].offset for i in spans], [extents[i].key for i in spans],
                                        [extents[i].size for i in spans])
        except ValueError:      # one extent is out of the file: the staged path names each record's own error
            return staged
        fd = ssd.fileno()
        for i, at in zip(spans, found):
            out[i] = FileSpan(fd, at, extents[i].size) if at is not None else KeyError(
                "checksum: SSD record header failed verification (served as a miss)")
        with self._lock:
            self._file_reads += len(found) - found.count(None)
        sent = set(spans)
        return [i for i in staged if i not in sent]

    @property
    def file_reads(self) -> int:
        """SSD records answered from the data file (FileSpans: a checked read's header checked, the payload sent
        with os.sendfile) since the node started."""
        return self._file_reads

    def _staging_many(self, sizes: list[int]) -> list[memoryview]:
        """A buffer per size, slices of this thread's staging buffer (grown to fit them, up to _SCRATCH_MAX) while
        they fit, then buffers of their own: reused, so a read pays no allocation and no first-touch page faults (a
        fresh 2 MiB bytearray costs both on every read), and a connection thread never keeps more than _SCRATCH_MAX."""
        total = sum(sizes)
        buf = getattr(self._scratch, "buf", None)
        if (buf is None or len(buf) < total) and total <= _SCRATCH_MAX:
            want = 1 << 20 if total <= 1 << 20 else _SCRATCH_MAX
            if buf is None or len(buf) < want:
                buf = self._scratch.buf = bytearray(want)
        view = memoryview(buf) if buf is not None else memoryview(b"")
        out, at = [], 0
        for size in sizes:
            if at + size <= len(view):
                out.append(view[at:at + size])
                at += size
            else:
                out.append(memoryview(bytearray(size)))
        return out
