"""Functional memories holding real bytes.

Device DRAM (16 GiB on ARIES) and host memory are sparse: pages are allocated on first
write, untouched bytes read as zero, so a large address space costs only what is used.
"""

from __future__ import annotations

import numpy as np

from isa.errors import DeviceError
from isa.instructions import Space


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
