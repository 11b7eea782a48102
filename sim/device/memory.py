"""Functional memories holding real bytes.

Device DRAM (16 GiB on ARIES) and host memory are sparse: pages are allocated on first
write, untouched bytes read as zero, so a large address space costs only what is used.
"""

from __future__ import annotations

import numpy as np

from isa.instructions import Space
from kvsim.errors import DeviceError


def span_bytes(rows: int, nbytes: int, stride: int) -> int:
    """The bytes from the first block's start to the last block's end: ``rows`` blocks of
    ``nbytes`` bytes, each ``stride`` bytes after the one before (0 without blocks)."""
    return (rows - 1) * stride + nbytes if rows > 0 else 0


def block_view(buf: np.ndarray, off: int, rows: int, nbytes: int, stride: int,
               *, writeable: bool = False) -> np.ndarray:
    """``rows`` blocks of ``nbytes`` bytes of the flat ``uint8`` array ``buf``, the first at
    ``off``, each ``stride`` bytes after the one before, as one ``[rows, nbytes]`` view (no
    copy; numpy refuses a span past the end of ``buf``). Read-only unless ``writeable``."""
    view = np.ndarray((rows, nbytes), np.uint8, buffer=buf, offset=off, strides=(stride, 1))
    if not writeable:
        view.flags.writeable = False
    return view


def as_bytes(data: np.ndarray) -> np.ndarray:
    """``data``'s bytes as a flat contiguous ``uint8`` array (a view where it can be; an
    array that is one already is returned as it is, without the three conversions)."""
    if (type(data) is np.ndarray and data.dtype == np.uint8 and data.ndim == 1
            and data.flags.c_contiguous):
        return data
    return np.ascontiguousarray(data).view(np.uint8).reshape(-1)


class SparseMemory:
    """A byte-addressable memory of ``size`` bytes stored as lazily allocated pages."""

    def __init__(self, size: int, name: str, page_bytes: int = 1 << 20):
        self.size = size
        self.name = name
        self.page_bytes = page_bytes
        self._pages: dict[int, np.ndarray] = {}

    @property
    def resident_bytes(self) -> int:
        return len(self._pages) * self.page_bytes

    def _check(self, addr: int, nbytes: int) -> None:
        if addr < 0 or nbytes < 0 or addr + nbytes > self.size:
            raise DeviceError(
                f"{self.name}: access [{addr:#x}, {addr + nbytes:#x}) outside {self.size} bytes"
            )

    def read(self, addr: int, nbytes: int) -> np.ndarray:
        self._check(addr, nbytes)
        pb = self.page_bytes
        page, off = divmod(addr, pb)
        if off + nbytes <= pb:  # within one page (most accesses): one copy
            data = self._pages.get(page)
            if data is None:
                return np.zeros(nbytes, dtype=np.uint8)
            return data[off : off + nbytes].copy()
        out = np.zeros(nbytes, dtype=np.uint8)
        pos = 0
        while pos < nbytes:
            a = addr + pos
            page, off = divmod(a, pb)
            take = min(pb - off, nbytes - pos)
            data = self._pages.get(page)
            if data is not None:
                out[pos : pos + take] = data[off : off + take]
            pos += take
        return out

    def write(self, addr: int, data: np.ndarray) -> None:
        data = as_bytes(data)
        nbytes = data.size
        self._check(addr, nbytes)
        pb = self.page_bytes
        page, off = divmod(addr, pb)
        if nbytes == 0:  # allocates no page
            return
        if off + nbytes <= pb:  # within one page (most accesses)
            buf = self._pages.get(page)
            if buf is None:
                buf = self._pages[page] = np.zeros(pb, dtype=np.uint8)
            buf[off : off + nbytes] = data
            return
        pos = 0
        while pos < nbytes:
            a = addr + pos
            page, off = divmod(a, pb)
            take = min(pb - off, nbytes - pos)
            buf = self._pages.get(page)
            if buf is None:
                buf = self._pages[page] = np.zeros(pb, dtype=np.uint8)
            buf[off : off + take] = data[pos : pos + take]
            pos += take

    def _page_runs(self, addr: int, rows: int, nbytes: int, stride: int):
        """The blocks in runs that share one page: ``(first row, rows, page, offset)``, a
        run of 0 rows for a block that crosses a page boundary (moved on its own)."""
        pb = self.page_bytes
        r = 0
        while r < rows:
            page, off = divmod(addr + r * stride, pb)
            if off + nbytes > pb:
                yield r, 0, page, off
                r += 1
                continue
            k = rows - r if stride == 0 else min(rows - r, (pb - off - nbytes) // stride + 1)
            yield r, k, page, off
            r += k

    def read_blocks(self, addr: int, rows: int, nbytes: int, stride: int) -> np.ndarray:
        """``rows`` blocks of ``nbytes`` bytes, the first at ``addr``, each ``stride`` bytes
        after the one before, as ``uint8[rows, nbytes]``: what ``rows`` calls of
        :meth:`read` return, in one copy per page."""
        self._check(addr, span_bytes(rows, nbytes, stride))
        out = np.empty((rows, nbytes), dtype=np.uint8)
        for r, k, page, off in self._page_runs(addr, rows, nbytes, stride):
            if k == 0:
                out[r] = self.read(addr + r * stride, nbytes)
                continue
            data = self._pages.get(page)
            if data is None:
                out[r : r + k] = 0
            else:
                out[r : r + k] = block_view(data, off, k, nbytes, stride)
        return out

    def write_blocks(self, addr: int, blocks: np.ndarray, stride: int) -> None:
        """Write the rows of ``blocks`` (``uint8[rows, nbytes]``), the first at ``addr``,
        each ``stride`` (>= ``nbytes``: the blocks do not overlap) bytes after the one
        before: what one :meth:`write` per row does (the same pages allocated), in one
        copy per page. The whole span is checked before any byte is written."""
        rows, nbytes = blocks.shape
        if rows > 1 and stride < nbytes:
            raise ValueError(f"{self.name}: blocks of {nbytes} bytes every {stride} bytes "
                             "overlap")
        self._check(addr, span_bytes(rows, nbytes, stride))
        if nbytes == 0:  # allocates no page
            return
        for r, k, page, off in self._page_runs(addr, rows, nbytes, stride):
            if k == 0:
                self.write(addr + r * stride, blocks[r])
                continue
            buf = self._pages.get(page)
            if buf is None:
                buf = self._pages[page] = np.zeros(self.page_bytes, dtype=np.uint8)
            block_view(buf, off, k, nbytes, stride, writeable=True)[:] = blocks[r : r + k]

    def discard(self, addr: int, nbytes: int) -> None:
        """Forget the pages wholly inside ``[addr, addr + nbytes)`` (they read as zeros
        again); pages only partly inside keep their bytes."""
        self._check(addr, nbytes)
        pb = self.page_bytes
        for page in range(-(-addr // pb), (addr + nbytes) // pb):
            self._pages.pop(page, None)


class DeviceMemory:
    """The three address spaces of the device, in the interface ``isa.semantics`` uses."""

    def __init__(self, *, dram_bytes: int, sram_bytes: int, num_cores: int, host_bytes: int):
        self.dram = SparseMemory(dram_bytes, "DRAM")
        self.host = SparseMemory(host_bytes, "host memory")
        self.sram_bytes = sram_bytes
        self.sram = [np.zeros(sram_bytes, dtype=np.uint8) for _ in range(num_cores)]

    def _sram(self, core: int, addr: int, nbytes: int) -> np.ndarray:
        if not 0 <= core < len(self.sram):
            raise DeviceError(f"SRAM: core {core} does not exist")
        if addr < 0 or addr + nbytes > self.sram_bytes:
            raise DeviceError(
                f"SRAM of core {core}: access [{addr:#x}, {addr + nbytes:#x}) overflows "
                f"{self.sram_bytes} bytes"
            )
        return self.sram[core][addr : addr + nbytes]

    def read(self, space: Space, core: int, addr: int, nbytes: int) -> np.ndarray:
        if space == Space.SRAM:
            return self._sram(core, addr, nbytes).copy()
        return (self.dram if space == Space.DRAM else self.host).read(addr, nbytes)

    def write(self, space: Space, core: int, addr: int, data: np.ndarray) -> None:
        data = as_bytes(data)
        if space == Space.SRAM:
            self._sram(core, addr, data.size)[:] = data
        else:
            (self.dram if space == Space.DRAM else self.host).write(addr, data)

    def read_blocks(self, space: Space, core: int, addr: int, rows: int, nbytes: int,
                    stride: int) -> np.ndarray:
        """``rows`` blocks of ``nbytes`` bytes, the first at ``addr``, each ``stride`` bytes
        after the one before, as ``uint8[rows, nbytes]`` (one :meth:`read` per row, in one
        copy)."""
        if space == Space.SRAM:
            span = self._sram(core, addr, span_bytes(rows, nbytes, stride))
            return block_view(span, 0, rows, nbytes, stride).copy()
        return (self.dram if space == Space.DRAM else self.host).read_blocks(addr, rows,
                                                                            nbytes, stride)

    def write_blocks(self, space: Space, core: int, addr: int, blocks: np.ndarray,
                     stride: int) -> None:
        """Write the rows of ``blocks`` (``uint8[rows, nbytes]``, ``stride >= nbytes``),
        the first at ``addr``, each ``stride`` bytes after the one before (one
        :meth:`write` per row, in one copy; the span is checked before any byte moves)."""
        rows, nbytes = blocks.shape
        if space != Space.SRAM:
            (self.dram if space == Space.DRAM else self.host).write_blocks(addr, blocks, stride)
            return
        if rows > 1 and stride < nbytes:
            raise ValueError(f"SRAM: blocks of {nbytes} bytes every {stride} bytes overlap")
        span = self._sram(core, addr, span_bytes(rows, nbytes, stride))
        if rows and nbytes:
            block_view(span, 0, rows, nbytes, stride, writeable=True)[:] = blocks
