"""Channel throughput against raw Ray transfers of the same items, measured in one run.

Moves numpy uint8 arrays (1 KB, 1 MB, 10 MB) from a producer Ray actor to the driver three ways:

  A  channel     the producer ``Channel.put``s each item (a Ray channel, maxsize=DEPTH; each put
                 returns once the item is stored); the driver ``get``s it. Items >= 64 KiB travel
                 by the channel's default transport: on this one-node cluster, shared memory (the
                 producer copies the bytes into its arena, the driver copies them out).
  O  object st.  as A with ``transport="object_store"``: items >= 64 KiB go by reference (producer
                 ray.put, the ObjectRef through the channel actor, driver ray.get).
  P  pipelined   as A, but the producer's handle has ``put_window=DEPTH/2`` and the channel
                 ``maxsize=DEPTH/2`` (so at most DEPTH items in flight, as in B): a put returns once
                 sent, the producer overlaps the next item with the transfer.
  B  object ref  raw Ray: the driver calls ``producer.put_ref()``, which ``ray.put``s the item and
                 returns the ObjectRef (wrapped in a list); the driver ``ray.get``s it. DEPTH calls in
                 flight, so both sides can pipeline.
  C  return      raw Ray: the driver calls ``producer.get_array()``, which returns the array (Ray
                 stores the return value); DEPTH calls in flight.

Headline: ratio = A / B throughput (rlweave channel with default, strictly-acknowledged puts / raw
object-store transfer), median of the per-pair ratios over interleaved repeats (A O P B C, A O P B C,
...), after a warm-up of each; ratio_object_store = O / B and ratio_pipelined = P / B likewise.

    python benchmarks/channel.py [--json FILE] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import ray

SIZES = [("1kb", 1 << 10), ("1mb", 1 << 20), ("10mb", 10 << 20)]
# items per timed run, chosen so that one run takes roughly 0.5-1.5 s on a 2-core machine
ITEMS = {"1kb": 300, "1mb": 100, "10mb": 30}
DEPTH = 8  # channel maxsize = raw-Ray calls in flight


def make_producer_class():
    """The producer actor class, defined in a function so that Ray ships it by value (this file is
    not an importable module when the CLI loads it by path)."""

    class Producer:
        def __init__(self, sizes: list[int]):
            rng = np.random.default_rng(0)
            self.arrays = {n: rng.integers(0, 255, size=n, dtype=np.uint8) for n in sizes}

        def ready(self) -> bool:
            return True

        def to_channel(self, ch, nbytes: int, n: int) -> int:
            arr = self.arrays[nbytes]
            for i in range(n):
                ch.put(arr, version=i)
            return n

        def put_ref(self, nbytes: int) -> list:
            return [ray.put(self.arrays[nbytes])]

        def get_array(self, nbytes: int) -> np.ndarray:
            return self.arrays[nbytes]

    return ray.remote(num_cpus=0)(Producer)


def _check(x: np.ndarray, nbytes: int) -> None:
    if x.nbytes != nbytes:  # the same (cheap) check on every side
        raise AssertionError(f"got {x.nbytes} bytes, expected {nbytes}")


def run_channel(producer, ch, nbytes: int, n: int) -> float:
    t0 = time.perf_counter()
    done = producer.to_channel.remote(ch, nbytes, n)
    for _ in range(n):
        _check(ch.get(timeout=120), nbytes)
    ray.get(done)
    return n / (time.perf_counter() - t0)


def _windowed(submit, fetch, nbytes: int, n: int) -> float:
    t0 = time.perf_counter()
    inflight = [submit() for _ in range(min(DEPTH, n))]
    submitted = len(inflight)
    for _ in range(n):
        ref = inflight.pop(0)
        if submitted < n:
            inflight.append(submit())
            submitted += 1
        _check(fetch(ref), nbytes)
    return n / (time.perf_counter() - t0)


def run_object_ref(producer, nbytes: int, n: int) -> float:
    return _windowed(lambda: producer.put_ref.remote(nbytes), lambda r: ray.get(ray.get(r)[0]), nbytes, n)


def run_return(producer, nbytes: int, n: int) -> float:
    return _windowed(lambda: producer.get_array.remote(nbytes), ray.get, nbytes, n)


def _ratio_summary(ratios: list[float]) -> dict:
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


SIDES = [  # key, JSON name, table heading
    ("A", "channel", "A channel"),
    ("O", "channel_object_store", "O chan. obj. store"),
    ("P", "channel_pipelined", "P chan. pipelined"),
    ("B", "object_ref", "B ray.put+ref"),
    ("C", "actor_return", "C actor return"),
]


def main(argv: list[str] | None = None) -> dict:
    from rlweave.channel import DEFAULT_REF_THRESHOLD, Channel

    ap = argparse.ArgumentParser(prog="rlweave bench channel", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="FILE", help="write the headline figures as one JSON object")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved A/O/P/B/C repeats (>= 3)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the items per run")
    args = ap.parse_args(argv)
    items = {k: max(3, int(v * args.scale)) for k, v in ITEMS.items()}
    half = DEPTH // 2

    started_ray = False
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        started_ray = True

    print("channel benchmark: numpy uint8 items, producer Ray actor -> driver")
    print(f"  ray {ray.__version__}, numpy {np.__version__}, python {sys.version.split()[0]}, cpus {os.cpu_count()}")
    print(f"  OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')} (no torch compute on any side)")
    print(f"  items per run: {items}; B, C: {DEPTH} calls in flight")
    print(f"  A, O: channel maxsize={DEPTH}, put_window=0;  P: channel maxsize={half}, put_window={half}")
    print(f"  repeats: {args.repeats} interleaved A O P B C after one warm-up of each")
    print(f"  channel threshold: {DEFAULT_REF_THRESHOLD} bytes (1 KB inline, 1 MB and 10 MB by the transport)")
    print("  processes: A, O, P = producer actor + channel actor + driver (3); B, C = producer actor + driver (2)")

    producer = make_producer_class().remote([nbytes for _, nbytes in SIZES])
    ray.get(producer.ready.remote())
    tag = f"{os.getpid()}-{time.time_ns()}"
    ch = Channel.create(f"bench-channel-{tag}", maxsize=DEPTH)
    cho = Channel.create(f"bench-channel-object-store-{tag}", maxsize=DEPTH, transport="object_store")
    chp = Channel.create(f"bench-channel-pipelined-{tag}", maxsize=half, put_window=half)
    ch.qsize(), cho.qsize(), chp.qsize()  # all actors up before timing
    print(f"  transports: A, P {ch.transport}; O {cho.transport}")
    runs = {
        "A": lambda nbytes, n: run_channel(producer, ch, nbytes, n),
        "O": lambda nbytes, n: run_channel(producer, cho, nbytes, n),
        "P": lambda nbytes, n: run_channel(producer, chp, nbytes, n),
        "B": lambda nbytes, n: run_object_ref(producer, nbytes, n),
        "C": lambda nbytes, n: run_return(producer, nbytes, n),
    }
    results = {label: {side: [] for side, *_ in SIDES} for label, _ in SIZES}
    t_start = time.perf_counter()
    try:
        for label, nbytes in SIZES:  # warm-up (discarded)
            for side, *_ in SIDES:
                runs[side](nbytes, max(3, items[label] // 5))
        for _ in range(max(1, args.repeats)):
            for label, nbytes in SIZES:
                for side, *_ in SIDES:
                    results[label][side].append(runs[side](nbytes, items[label]))
        stats = ch.stats()
    finally:
        ch.close()
        cho.close()
        chp.close()
        ray.kill(producer)
        if started_ray:
            ray.shutdown()
    elapsed = time.perf_counter() - t_start

    out: dict = {
        "benchmark": "channel",
        "baseline": "raw Ray object-store transfer (producer ray.put + ref, consumer ray.get)",
        "settings": {
            "items": items,
            "depth": DEPTH,
            "repeats": args.repeats,
            "ref_threshold": DEFAULT_REF_THRESHOLD,
            "pipelined": {"maxsize": half, "put_window": half},
            "transport": ch.transport,
        },
        "channel_puts_shm": stats["puts_shm"],
        "channel_puts_by_ref": stats["puts_by_ref"],
        "channel_puts_inline": stats["puts_inline"],
    }
    header = " | ".join([f"{'size':>5}"] + [f"{h:>20}" for *_, h in SIDES])
    header += f" | {'A/B median (min-max)':>21} | {'O/B':>5} | {'P/B median (min-max)':>21} | {'A/C':>5}"
    print()
    print("medians, items/s (MB/s):")
    print(header)
    print("-" * len(header))
    for label, nbytes in SIZES:
        r = results[label]
        med = {side: statistics.median(v) for side, v in r.items()}
        ab = _ratio_summary([a / b for a, b in zip(r["A"], r["B"])])
        ob = _ratio_summary([o / b for o, b in zip(r["O"], r["B"])])
        pb = _ratio_summary([p / b for p, b in zip(r["P"], r["B"])])
        ac = _ratio_summary([a / c for a, c in zip(r["A"], r["C"])])
        mb = nbytes / 1e6
        cells = [f"{med[side]:9.1f} ({med[side] * mb:8.1f})" for side, *_ in SIDES]
        rat = lambda x: f"{x['median']:5.2f} ({x['min']:.2f}-{x['max']:.2f})".ljust(21)  # noqa: E731
        print(" | ".join([f"{label:>5}"] + cells + [rat(ab), f"{ob['median']:5.2f}", rat(pb), f"{ac['median']:5.2f}"]))
        out[f"ratio_{label}"] = ab["median"]
        out[f"ratio_{label}_min"] = ab["min"]
        out[f"ratio_{label}_max"] = ab["max"]
        out[f"ratio_object_store_{label}"] = ob["median"]
        out[f"ratio_pipelined_{label}"] = pb["median"]
        out[f"ratio_pipelined_{label}_min"] = pb["min"]
        out[f"ratio_pipelined_{label}_max"] = pb["max"]
        out[f"ratio_vs_return_{label}"] = ac["median"]
        for side, name, _ in SIDES:
            out[f"{name}_items_per_s_{label}"] = med[side]
            out[f"{name}_mb_per_s_{label}"] = med[side] * mb
    out["elapsed_s"] = elapsed
    print()
    for key, what in (
        ("ratio", f"channel ({ch.transport})"),
        ("ratio_object_store", "channel (object store)"),
        ("ratio_pipelined", f"pipelined channel ({ch.transport})"),
    ):
        print(
            f"{key}: {what} / raw Ray object-store transfer, median of {args.repeats} pairs: "
            + ", ".join(f"{label} {out[f'{key}_{label}']:.2f}" for label, _ in SIZES)
        )
    print(f"[{elapsed:.0f} s timed; python benchmarks/channel.py]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
        print(f"wrote {args.json}")
    return out


if __name__ == "__main__":
    main()
