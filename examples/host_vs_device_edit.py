"""Host-side vs on-device KV-cache eviction: what each costs on the simulated card.

For each cache length (a model compiled with that cache capacity, the cache full), the
same eviction (drop every 10th token after the first 4) is done
once on the host (dump every cache over PCIe, decode, edit, encode, load back) and once on
the device (a KvRead/KvWrite compaction program, DRAM only), on Qwen2.5-0.5B W8 with an
int8 cache on the aries preset (timing-only: the costs do not depend on the values).

    python examples/host_vs_device_edit.py [--hw aries] [--kv int8] [--tokens 512 2048 8192]
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from models.bits import build_bit_config
from sim.device.hw import load_hardware
from sim.runtime.cacheops import evict_positions
from sim.runtime.ready import ready_model


def compare(hw_name: str, kv: str, tokens: list[int], model: str = "qwen2.5-0.5b") -> list:
    hw = load_hardware(hw_name)
    rows = []
    for n in tokens:
        # a full cache: compiled with max_cache_length = n (dumps move the whole cache)
        ready = ready_model(model, hw, bits=build_bit_config({}), kv=kv, max_seq=16, cap=n,
                            functional=False)
        drop = list(range(4, n, 10))
        for where in ("host", "device"):
            m = ready.launch()  # a fresh card each time
            if where == "host":
                r = m.edit_cache_on_host(evict_positions(drop), cache_size=n)
            else:
                r = m.evict_on_device(drop, cache_size=n)
            rows.append({"tokens": n, "dropped": len(drop), **r.as_metrics()})
            m.dispose()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hw", default="aries")
    p.add_argument("--kv", default="int8")
    p.add_argument("--tokens", type=int, nargs="+", default=[512, 2048, 8192])
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    rows = compare(a.hw, a.kv, a.tokens)
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    t = Table(title=f"evict every 10th token: host vs device ({a.hw}, kv={a.kv})")
    for col in ("cache tokens", "path", "time", "PCIe bytes", "DRAM bytes", "host time (model)"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(f"{r['tokens']:,}", r["where"], f"{r['time_s'] * 1e3:.3f} ms",
                  f"{r['pcie_bytes']:,}", f"{r['dram_bytes']:,}",
                  f"{r['host_model_s'] * 1e3:.3f} ms" if r["where"] == "host" else "-")
    Console().print(t)


if __name__ == "__main__":
    main()
