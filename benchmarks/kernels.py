"""Speed of kvsim's integer kernels against this machine's streaming read bandwidth.

Measures, in one run: the machine's streaming read bandwidth (a Numba read of a large array,
on one thread and on all of Numba's threads, the better one counts), int8 and int4 GEMV on
weight matrices of the same size, four times the last-level cache (256 MiB at least), and
2/4-bit pack/unpack; each against a plain numpy reference; and the int8 GEMM tiles of a
compiled prefill (``(40-86) x 576-1536 x (16-60)``) through ``matrix.matmul`` (float32
BLAS, exact) against the integer kernel, in multiply-accumulates per second on one
thread. Prints a table, or with
``--json`` one JSON object with ``gemv_int8_weight_bytes_per_s``,
``gemv_int4_weight_bytes_per_s``, ``stream_read_bytes_per_s`` and more. Goals (issue
"Integer kernels and KV-cache formats"): int8 GEMV >= 70 % and int4 GEMV >= 50 % of the
streaming read bandwidth. Timed cases run in turn and the best of ``--repeat`` runs counts.

Usage: ``python benchmarks/kernels.py [--json] [--repeat N] [--tiles | --attention]``
(``--tiles``: only the GEMM tiles, without the large GEMV and stream arrays;
``--attention``: only one attention call of an 8,192-token prefill through both KV read
paths).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import resource
import time
from pathlib import Path

import numba
import numpy as np
from numba import njit, prange

from isa.kernels import matrix, pack

MIB = 1 << 20


def llc_bytes() -> int:
    """Size of the largest CPU cache (sysfs; 32 MiB when unknown)."""
    best = 0
    for idx in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (idx / "size").read_text().strip()
        except OSError:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
        best = max(best, int(text.rstrip("KMG")) * mult)
    return best or 32 * MIB


@njit(cache=True)
def _xor_words(a):
    s = np.uint64(0)
    for i in range(a.shape[0]):
        s ^= a[i]
    return s


@njit(cache=True, parallel=True)
def _xor_words_par(a, chunks):
    n = a.shape[0]
    step = (n + chunks - 1) // chunks
    parts = np.zeros(chunks, np.uint64)
    for c in prange(chunks):
        parts[c] = _xor_words(a[c * step:min(n, (c + 1) * step)])
    s = np.uint64(0)
    for c in range(chunks):
        s ^= parts[c]
    return s


def best_time(fn, repeat: int, warm: bool = True) -> float:
    if warm:
        fn()  # warm-up (and compile, or load from the cache)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def stream_words(nbytes: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 2**63, nbytes // 8, dtype=np.uint64)


def gemv_operands(bits: int, n: int, k: int, rng: np.random.Generator):
    """(x, w, numpy reference) of one GEMV case, checked against the reference once."""
    x = rng.integers(-128, 128, (1, k), dtype=np.int8)
    if bits == 8:
        w = rng.integers(-128, 128, (n, k), dtype=np.int8)

        def ref() -> np.ndarray:
            return w.astype(np.int32) @ x[0].astype(np.int32)
    else:
        w = rng.integers(0, 256, (n, (k + 1) // 2), dtype=np.uint8)
        xe = x[0, 0::2].astype(np.int32)
        xo = x[0, 1::2].astype(np.int32)

        def ref() -> np.ndarray:
            lo = (w & 15).astype(np.int32)
            hi = (w >> 4).astype(np.int32)
            lo[lo >= 8] -= 16
            hi[hi >= 8] -= 16
            return lo @ xe + hi @ xo

    if not np.array_equal(matrix.matmul(x, w, bits, k)[0], ref().astype(np.int32)):
        raise AssertionError(f"int{bits} GEMV disagrees with the numpy reference")
    return x, w, ref


def interleaved_best(cases: dict, repeat: int) -> dict:
    """Best time of each case, the cases run in turn ``repeat`` times, so that they all see
    the same machine conditions (other processes, frequency)."""
    for fn in cases.values():
        fn()
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(repeat):
        for name, fn in cases.items():
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def pack_case(bits: int, rows: int, n: int, repeat: int, rng: np.random.Generator) -> dict:
    codes = rng.integers(0, 1 << bits, (rows, n), dtype=np.uint8)
    nb = pack.packed_bytes(n, bits)
    out = np.empty((rows, nb), np.uint8)
    back = np.empty((rows, n), np.uint8)
    per = 8 // bits

    def ref_pack() -> np.ndarray:
        acc = np.zeros((rows, nb), np.uint8)
        for j in range(per):
            acc |= codes[:, j::per] << (bits * j)
        return acc

    def ref_unpack() -> np.ndarray:
        res = np.empty((rows, n), np.uint8)
        for j in range(per):
            res[:, j::per] = (out >> (bits * j)) & ((1 << bits) - 1)
        return res

    pack.pack_rows(codes, bits, out)
    pack.unpack_rows(out, bits, n, back)
    if not (np.array_equal(out, ref_pack()) and np.array_equal(back, codes)
            and np.array_equal(ref_unpack(), codes)):
        raise AssertionError(f"{bits}-bit pack/unpack disagrees with the numpy reference")
    t_p = best_time(lambda: pack.pack_rows(codes, bits, out), repeat)
    t_u = best_time(lambda: pack.unpack_rows(out, bits, n, back), repeat)
    t_pr = best_time(ref_pack, max(1, repeat // 3))
    t_ur = best_time(ref_unpack, max(1, repeat // 3))
    return {"bits": bits, "codes": rows * n, "packed_bytes": out.nbytes,
            "pack_packed_bytes_per_s": out.nbytes / t_p, "pack_speedup": t_pr / t_p,
            "unpack_packed_bytes_per_s": out.nbytes / t_u, "unpack_speedup": t_ur / t_u}


#: (rows, k, columns) of the int8 GEMM tiles a compiled SmolLM2-135M prefill issues most
#: (counted by wrapping ``matrix.matmul`` in a 600-token eval).
PREFILL_TILES = ((86, 576, 60), (40, 576, 60), (86, 576, 36), (86, 1536, 16))


def _calls(fn, args: tuple, n: int) -> None:
    for _ in range(n):
        fn(*args)


def tile_cases(repeat: int, rng: np.random.Generator) -> list[dict]:
    """Each prefill tile through ``matrix.matmul`` (its float32 BLAS path) and through the
    integer kernel ``matrix.gemm_i8``, one thread each; the results must agree."""
    from isa.kernels.exact import blas_one_thread

    out = []
    for m, k, n in PREFILL_TILES:
        a = rng.integers(-128, 128, (m, k), dtype=np.int8)
        w = rng.integers(-128, 128, (n, k), dtype=np.int8)
        acc = np.empty((m, n), np.int32)
        matrix.gemm_i8(a, w, acc)
        if not np.array_equal(matrix.matmul(a, w, 8, k), acc):
            raise SystemExit(f"tile {m}x{k}x{n}: the BLAS path differs from the integer kernel")
        calls = max(1, int(2e8 // (m * k * n)))  # ~0.2 G multiply-accumulates per timing
        with blas_one_thread():
            t = interleaved_best({
                "blas": functools.partial(_calls, matrix.matmul, (a, w, 8, k), calls),
                "integer": functools.partial(_calls, matrix.gemm_i8, (a, w, acc), calls),
            }, repeat)
        macs = calls * m * k * n
        out.append({"shape": [m, k, n], "blas_macs_per_s": macs / t["blas"],
                    "integer_macs_per_s": macs / t["integer"]})
    return out


#: (queries, heads, KV heads, head dim, keys) of an attention call late in a SmolLM2-135M
#: prefill at 8,192 tokens: a core's calls hold one KV head and its 3 query heads.
ATTENTION_CALL = (86, 3, 1, 64, 8192)


def attention_cases(repeat: int, rng: np.random.Generator) -> dict:
    """One such call through the dequantize-on-read kernel (``attention_fp.attend_fp``:
    fp16 operands, fp32 sums) and the integer one (``attention.attend``: exact sums on
    float BLAS), and the absmax scans of q, K and V that int8 operands skip
    (``attention.blas_bounds``), one thread, in milliseconds."""
    from isa.kernels import attention, attention_fp
    from isa.kernels.exact import absmax, blas_one_thread

    L, H, KH, D, T = ATTENTION_CALL
    pos = T - L
    f16 = [rng.normal(0, 2, s).astype(np.float16).astype(np.float32)
           for s in ((L, H, D), (T, KH, D), (T, KH, D))]
    i8 = [rng.integers(-128, 128, s, dtype=np.int8) for s in ((L, H, D), (T, KH, D), (T, KH, D))]
    kw = dict(pos=pos, score_mult=1 << 14, score_shift=10, out_mult=1 << 10, out_shift=30)
    with blas_one_thread():
        t = interleaved_best({
            "fp": lambda: attention_fp.attend_fp(*f16, pos=pos, scale=0.125, out_scale=20.0),
            "integer": lambda: attention.attend(*i8, **kw),
            "scans": lambda: [absmax(x) for x in i8],
        }, repeat)
    return {"shape": list(ATTENTION_CALL), **{f"{k}_ms": v * 1e3 for k, v in t.items()}}


def report_attention(a: dict) -> str:
    L, H, KH, D, T = a["shape"]
    return (f"attention call ({L} queries x {H} heads on {KH} KV head, {T} keys, one thread): "
            f"fp16 (dequantize-on-read) {a['fp_ms']:.1f} ms, integer on BLAS "
            f"{a['integer_ms']:.1f} ms, the int8 absmax scans it skips {a['scans_ms']:.2f} ms")


def run(repeat: int) -> dict:
    t0 = time.perf_counter()
    x = np.zeros((1, 64), np.int8)
    matrix.matmul(x, np.zeros((4, 64), np.int8), 8, 64)
    matrix.matmul(x, np.zeros((4, 32), np.uint8), 4, 64)
    first_call_s = time.perf_counter() - t0  # compile, or load from Numba's cache
    rng = np.random.default_rng(0)
    llc = llc_bytes()
    # Arrays of 4x the last-level cache (256 MiB at least): a VM's two vCPUs may sit on two
    # L3 slices, so "2x" would still partly hit in cache (measured here: a 64 MiB read runs
    # at 46 GB/s, 256 MiB and more at 36 GB/s).
    target = max(256 * MIB, 4 * llc)
    k = 16384
    n8 = -(-target // k)
    n4 = -(-target // (k // 2))
    words = stream_words(target)
    threads = numba.get_num_threads()
    x8, w8, ref8 = gemv_operands(8, n8, k, rng)
    x4, w4, ref4 = gemv_operands(4, n4, k, rng)
    t = interleaved_best({
        "stream1": lambda: _xor_words(words),
        "stream": lambda: _xor_words_par(words, threads),
        "gemv8": lambda: matrix.matmul(x8, w8, 8, k),
        "gemv4": lambda: matrix.matmul(x4, w4, 4, k),
    }, repeat)
    stream = {"one_thread": words.nbytes / t["stream1"],
              "all_threads": words.nbytes / t["stream"]}
    stream["best"] = max(stream["one_thread"], stream["all_threads"])
    g8 = {"n": n8, "k": k, "weight_bytes_per_s": w8.nbytes / t["gemv8"],
          "speedup": best_time(ref8, 1, warm=False) / t["gemv8"]}
    g4 = {"n": n4, "k": k, "weight_bytes_per_s": w4.nbytes / t["gemv4"],
          "speedup": best_time(ref4, 1, warm=False) / t["gemv4"]}
    packs = [pack_case(b, 4096, 8192, repeat, rng) for b in (4, 2)]
    numba.set_num_threads(1)
    tiles = tile_cases(repeat, rng)
    numba.set_num_threads(threads)
    sb = stream["best"]
    return {
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "numba_threads": numba.get_num_threads(),
                    "threading_layer": numba.threading_layer(), "llc_bytes": llc},
        "first_call_s": first_call_s,
        "stream_read_bytes_per_s": sb,
        "stream_read_one_thread_bytes_per_s": stream["one_thread"],
        "stream_read_all_threads_bytes_per_s": stream["all_threads"],
        "gemv_int8_weight_bytes_per_s": g8["weight_bytes_per_s"],
        "gemv_int8_of_stream": g8["weight_bytes_per_s"] / sb,
        "gemv_int8_speedup_over_numpy": g8["speedup"],
        "gemv_int8_shape": [g8["n"], g8["k"]],
        "gemv_int4_weight_bytes_per_s": g4["weight_bytes_per_s"],
        "gemv_int4_of_stream": g4["weight_bytes_per_s"] / sb,
        "gemv_int4_speedup_over_numpy": g4["speedup"],
        "gemv_int4_shape": [g4["n"], g4["k"]],
        "pack": packs,
        "gemm_tiles": tiles,
    }


def report(r: dict) -> str:
    gb = 1e9
    m = r["machine"]
    lines = [
        f"machine: {m['cpu']}, {m['cpus']} CPUs, {m['numba_threads']} Numba threads "
        f"({m['threading_layer']}), last-level cache {m['llc_bytes'] / MIB:.0f} MiB",
        f"first kernel calls (Numba cache load): {r['first_call_s'] * 1e3:.0f} ms",
        f"stream read: {r['stream_read_bytes_per_s'] / gb:.1f} GB/s "
        f"(1 thread {r['stream_read_one_thread_bytes_per_s'] / gb:.1f}, "
        f"all threads {r['stream_read_all_threads_bytes_per_s'] / gb:.1f})",
    ]
    for b, goal in ((8, 0.70), (4, 0.50)):
        n, k = r[f"gemv_int{b}_shape"]
        frac = r[f"gemv_int{b}_of_stream"]
        lines.append(
            f"int{b} GEMV {n}x{k}: {r[f'gemv_int{b}_weight_bytes_per_s'] / gb:.1f} GB/s of "
            f"weights, {100 * frac:.0f} % of stream read (goal {100 * goal:.0f} %: "
            f"{'met' if frac >= goal else 'NOT met'}), "
            f"{r[f'gemv_int{b}_speedup_over_numpy']:.0f}x numpy")
    for p in r["pack"]:
        lines.append(
            f"{p['bits']}-bit pack: {p['pack_packed_bytes_per_s'] / gb:.2f} GB/s packed "
            f"({p['pack_speedup']:.1f}x numpy); unpack: "
            f"{p['unpack_packed_bytes_per_s'] / gb:.2f} GB/s packed "
            f"({p['unpack_speedup']:.1f}x numpy)")
    return "\n".join([*lines, report_tiles(r)])


def report_tiles(r: dict) -> str:
    return "\n".join(
        f"int8 GEMM tile {m}x{k}x{n}: {g['blas_macs_per_s'] / 1e9:.1f} G MAC/s on float32 "
        f"BLAS, {g['integer_macs_per_s'] / 1e9:.1f} on the integer kernel (one thread)"
        for g in r["gemm_tiles"] for m, k, n in [g["shape"]])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--repeat", type=int, default=7, help="timed runs per case (best counts)")
    ap.add_argument("--tiles", action="store_true",
                    help="only the prefill GEMM tiles (no large arrays)")
    ap.add_argument("--attention", action="store_true",
                    help="only an 8K prefill's attention call, both read paths")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    if args.attention or args.tiles:  # the small cases alone, on one thread
        numba.set_num_threads(1)
        r = ({"attention": attention_cases(args.repeat, rng)} if args.attention else
             {"gemm_tiles": tile_cases(args.repeat, rng)})
        text = report_attention(r["attention"]) if args.attention else report_tiles(r)
    else:
        r = run(args.repeat)
        text = report(r)
    # peak resident memory of this process (Linux reports ru_maxrss in KiB)
    r["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(r, indent=2) if args.json else text
          + f"\npeak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB")

if __name__ == "__main__":
    main()
