"""Channel throughput against raw Ray transfers of the same items, measured in one run.

Moves numpy uint8 arrays (1 KB, 1 MB, 10 MB) from a producer Ray actor to the driver:

  A  channel     the producer ``Channel.put``s each item (a Ray channel, maxsize=DEPTH; each put
                 returns once the item is stored); the driver ``get``s it. Items >= 64 KiB travel
                 by the channel's default transport: on this one-node cluster, shared memory (the
                 producer copies the bytes into its arena, the driver copies them out); puts and
                 gets reach the channel actor by direct socket calls (the default on one node).
  V  views       as A, and the driver reads through ``with_views()``: its arrays are read-only views
                 of the producer's shared memory (no copy out), as every raw-Ray side's arrays are
                 read-only views of the object store or of the compiled graph's buffer.
  R  Ray calls   as A with ``calls="ray"``: puts and gets are Ray actor calls (the default before
                 direct calls).
  O  object st.  as A with ``transport="object_store"``: items >= 64 KiB go by reference.
  P  pipelined   as A, with ``put_window=DEPTH/2`` and ``maxsize=DEPTH/2`` (at most DEPTH items in
                 flight): a put returns once sent, the producer overlaps the next item.
  W  windowed    as P, and the driver reads through ``with_get_window(DEPTH/2)``: one call to the
                 channel takes up to DEPTH/2 ready items (the channel's own options for one
                 producer and one consumer, as the compiled graph is for one pair).
  B  put + ref   raw Ray: ``producer.put_ref()`` ``ray.put``s the item and returns the ObjectRef (in
                 a list); the driver ``ray.get``s both. DEPTH calls in flight.
  C  return      raw Ray: ``producer.get_array()`` returns the array (Ray stores the return
                 value); the driver ``ray.get``s it. DEPTH calls in flight.
  G  compiled    Ray compiled graph (``dag.experimental_compile()``, shared-memory channels) over a
                 producer actor of its own: ``execute(nbytes)`` then ``ray.get``, DEPTH in flight.
                 Where it does not run, the JSON says why (``compiled_graph``).

The baseline at each size is the fastest raw-Ray pattern there (B, C or G, by median): the
headline ``ratio_<size>`` = V / that pattern, median of the per-round ratios (like for like: the
driver ends up with read-only arrays on both sides); ``ratio_copy_<size>`` = A / that pattern (the
channel's default, writable copies). The ratios against
each pattern are written beside it. Each run moves enough items for at least 1 s of timed work
(counts found in the warm-up, per side and size). Rounds alternate the order of the sides
(A O P B C G, G C B P O A, ...). All sides share one consumer (this process) and one Ray
instance, so their processes have one environment by construction; whether the array the driver
ends up with is writable (its own copy) or a read-only view of shared memory is written per side
(``writable_array``).

    rlweave bench channel [--json FILE] [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import ray

sys.path.append(str(Path(__file__).resolve().parent))  # `rlweave bench` loads this file by path
import _common as C  # noqa: E402

SIZES = [("1kb", 1 << 10), ("1mb", 1 << 20), ("10mb", 10 << 20)]
START_ITEMS = {"1kb": 64, "1mb": 16, "10mb": 4}  # first guess; the warm-up doubles it to >= 1 s per run
DEPTH = 8  # channel maxsize = raw-Ray calls in flight
SIDES = {  # key -> (JSON name, description)
    "A": ("channel", "rlweave Channel, default transport, acknowledged puts"),
    "V": ("channel_views", "rlweave Channel, default transport, consumer with_views() (read-only arrays, no copy out)"),
    "R": ("channel_ray_calls", "rlweave Channel, default transport, calls='ray'"),
    "O": ("channel_object_store", "rlweave Channel, transport=object_store"),
    "P": ("channel_pipelined", f"rlweave Channel, put_window={DEPTH // 2}, maxsize={DEPTH // 2}"),
    "W": ("channel_windowed", f"rlweave Channel, put_window={DEPTH // 2}, maxsize={DEPTH // 2}, consumer get_window={DEPTH // 2}"),
    "B": ("put_ref", f"raw Ray: actor ray.put + ref in a list, 2 ray.get; {DEPTH} calls in flight"),
    "C": ("return", f"raw Ray: actor returns the array, ray.get; {DEPTH} calls in flight"),
    "G": ("compiled_graph", f"Ray compiled graph (experimental_compile), {DEPTH} executions in flight"),
}
RAW = ("B", "C", "G")


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


def _check(x: np.ndarray, nbytes: int) -> bool:
    if x.nbytes != nbytes:  # the same (cheap) check on every side
        raise AssertionError(f"got {x.nbytes} bytes, expected {nbytes}")
    return bool(x.flags.writeable)


def run_channel(producer, ch, nbytes: int, n: int, reader=None) -> tuple[float, bool]:
    """Seconds for ``n`` items, and whether the driver's arrays were writable (its own).
    ``reader``: the driver's handle, when not ``ch`` (a get window)."""
    reader = reader or ch
    t0 = time.perf_counter()
    done = producer.to_channel.remote(ch, nbytes, n)
    owns = all([_check(reader.get(timeout=120), nbytes) for _ in range(n)])
    ray.get(done)
    return time.perf_counter() - t0, owns


def _windowed(submit, fetch, nbytes: int, n: int) -> tuple[float, bool]:
    t0 = time.perf_counter()
    inflight = [submit() for _ in range(min(DEPTH, n))]
    submitted, owns = len(inflight), True
    for _ in range(n):  # fetch the oldest, then refill: never more than DEPTH in flight
        owns = _check(fetch(inflight.pop(0)), nbytes) and owns
        if submitted < n:
            inflight.append(submit())
            submitted += 1
    return time.perf_counter() - t0, owns


def profile_item(ch, nbytes: int, n: int = 40) -> dict:
    """Where one channel item's time goes, part by part, in this process (milliseconds, medians of
    ``n``): encoding into the producer's shared-memory arena (pickle + one copy), decoding out of
    it (one copy into fresh memory + unpickle), one put and one get of a tiny item through the
    channel actor (the descriptor's two hops: call, queue, reply), and the floor, one ``memcpy``
    of the item into memory already faulted in."""
    from rlweave.channel import _shm
    from rlweave.channel._encoding import _shm_or_none

    arr = np.random.default_rng(0).integers(0, 255, size=nbytes, dtype=np.uint8)
    dst = np.empty_like(arr)
    parts: dict[str, list[float]] = {"encode_ms": [], "decode_ms": [], "hops_ms": [], "memcpy_ms": []}
    for i in range(n):
        t0 = time.perf_counter()
        desc = _shm_or_none(arr, 1)
        t1 = time.perf_counter()
        _check(_shm.read(desc, "profile"), nbytes)
        t2 = time.perf_counter()
        ch.put(i)
        ch.get(timeout=60)
        t3 = time.perf_counter()
        np.copyto(dst, arr)
        t4 = time.perf_counter()
        for key, a, b in (("encode_ms", t0, t1), ("decode_ms", t1, t2), ("hops_ms", t2, t3), ("memcpy_ms", t3, t4)):
            parts[key].append((b - a) * 1e3)
    return {k: C.median(v) for k, v in parts.items()}


def compile_graph(producer_cls, sizes: list[int]):
    """A compiled graph over a producer of its own (an actor in a compiled graph serves only
    it), or the reason it does not run here."""
    try:
        from ray.dag import InputNode

        producer = producer_cls.remote(sizes)
        ray.get(producer.ready.remote())
        with InputNode() as inp:
            dag = producer.get_array.bind(inp)
        return dag.experimental_compile(_max_inflight_executions=DEPTH), producer, None
    except Exception as e:  # noqa: BLE001 - any failure means "not on this machine"; recorded
        return None, None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def main(argv: list[str] | None = None) -> int:
    from rlweave.channel import DEFAULT_REF_THRESHOLD, Channel

    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="rlweave bench channel", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="FILE", help="write the headline figures as one JSON object")
    ap.add_argument("--repeats", type=int, default=5, help="measured rounds (>= 3)")
    ap.add_argument("--min-seconds", type=float, default=C.MIN_TIMED_S, help="least timed work per run (default 1 s)")
    ap.add_argument("--no-compiled-graph", action="store_true", help="leave out the Ray compiled-graph side")
    args = ap.parse_args(argv)
    half = DEPTH // 2
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    cls = make_producer_class()
    producer = cls.remote([nbytes for _, nbytes in SIZES])
    ray.get(producer.ready.remote())
    tag = f"{os.getpid()}-{time.time_ns()}"
    ch = Channel.create(f"bench-channel-{tag}", maxsize=DEPTH)
    chr_ = Channel.create(f"bench-channel-ray-calls-{tag}", maxsize=DEPTH, calls="ray")
    cho = Channel.create(f"bench-channel-object-store-{tag}", maxsize=DEPTH, transport="object_store")
    chp = Channel.create(f"bench-channel-pipelined-{tag}", maxsize=half, put_window=half)
    chw = Channel.create(f"bench-channel-windowed-{tag}", maxsize=half, put_window=half)
    ch.qsize(), chr_.qsize(), cho.qsize(), chp.qsize(), chw.qsize()  # all actors up before timing
    graph, graph_producer, graph_error = (None, None, "left out (--no-compiled-graph)") if args.no_compiled_graph else \
        compile_graph(cls, [nbytes for _, nbytes in SIZES])
    runs = {
        "A": lambda nbytes, n: run_channel(producer, ch, nbytes, n),
        "V": lambda nbytes, n: run_channel(producer, ch, nbytes, n, reader=ch.with_views()),
        "R": lambda nbytes, n: run_channel(producer, chr_, nbytes, n),
        "O": lambda nbytes, n: run_channel(producer, cho, nbytes, n),
        "P": lambda nbytes, n: run_channel(producer, chp, nbytes, n),
        "W": lambda nbytes, n: run_channel(producer, chw, nbytes, n, reader=chw.with_get_window(half)),
        "B": lambda nbytes, n: _windowed(lambda: producer.put_ref.remote(nbytes), lambda r: ray.get(ray.get(r)[0]), nbytes, n),
        "C": lambda nbytes, n: _windowed(lambda: producer.get_array.remote(nbytes), ray.get, nbytes, n),
    }
    if graph is not None:
        runs["G"] = lambda nbytes, n: _windowed(lambda: graph.execute(nbytes), ray.get, nbytes, n)
    sides = list(runs)
    configs = {SIDES[s][0]: {"key": s, "what": SIDES[s][1]} for s in sides}
    out = C.report("channel", argv, "items/s producer actor -> driver; ratio_<size> = median over rounds of channel read as views (V) / "
                   "the fastest raw-Ray pattern at that size (B, C or G), read-only arrays on both sides; ratio_copy_<size>: "
                   "the channel's default (A, writable copies) / the same pattern", configs, args.repeats)
    out["protocol"].update(each_side_in_own_process="all sides: one consumer (the driver) and one Ray instance; producers are actors",
                           min_timed_s_per_run=args.min_seconds)
    print("channel benchmark: numpy uint8 items, producer Ray actor -> driver")
    print(f"  {out['environment']['cpu_model']}, {out['environment']['cpus']} cpus, ray {ray.__version__}; sides: "
          + "; ".join(f"{s} {SIDES[s][1]}" for s in sides))
    print(f"  compiled graph: {'runs' if graph is not None else graph_error}; transports: A, P {ch.transport}; O {cho.transport}")
    print(f"  order of the rounds: {' | '.join(out['protocol']['order'])}")
    items: dict[str, dict[str, int]] = {}
    results = {label: {s: [] for s in sides} for label, _ in SIZES}
    owns: dict[str, bool] = {}
    t_start = time.perf_counter()
    try:
        for label, nbytes in SIZES:  # warm-up: finds each side's items per run (discarded)
            items[label] = {s: C.grow_until(lambda k, s=s: runs[s](nbytes, k)[0], START_ITEMS[label], args.min_seconds)
                            for s in sides}
        print(f"  items per run (>= {args.min_seconds:g} s each): {items}")
        for order in C.pair_order(sides, args.repeats):
            for label, nbytes in SIZES:
                for s in order:
                    seconds, own = runs[s](nbytes, items[label][s])
                    results[label][s].append(items[label][s] / seconds)
                    owns[s] = own
        stats = ch.stats()
        profile = profile_item(ch, SIZES[-1][1])
    finally:
        for c in (ch, chr_, cho, chp, chw):
            c.close()
        if graph is not None:
            graph.teardown()
            ray.kill(graph_producer)
        ray.kill(producer)
        if started_ray:
            ray.shutdown()
    elapsed = time.perf_counter() - t_start
    out.update({"baseline": "the fastest raw-Ray pattern at each size (put_ref, return or compiled_graph)",
                "compiled_graph": {"ran": graph is not None, "reason": graph_error},
                "settings": {"items_per_run": items, "depth": DEPTH, "repeats": args.repeats, "ref_threshold": DEFAULT_REF_THRESHOLD,
                             "pipelined": {"maxsize": half, "put_window": half},
                             "windowed": {"maxsize": half, "put_window": half, "get_window": half}, "transport": ch.transport, "calls": stats.get("calls")},
                "writable_array": {SIDES[s][0]: owns.get(s) for s in sides},
                "channel_puts": {k: stats.get(k) for k in ("puts_shm", "puts_by_ref", "puts_inline")},
                "profile_10mb": {**profile, "what": "ms per 10 MB item, medians: encode = pickle + copy into the arena; decode = "
                                 "copy out + unpickle; hops = one put and one get of a tiny item through the channel actor (direct calls); "
                                 "memcpy = one copy into memory already faulted in (the floor)"}})
    print("\nmedians, items/s (MB/s); ratios over rounds against the fastest raw pattern")
    for label, nbytes in SIZES:
        r = results[label]
        raw = {SIDES[s][0]: r[s] for s in RAW if s in r}
        head = C.ratio_vs_fastest(r["V"], raw)
        out[f"ratio_{label}"], out[f"ratio_{label}_min"], out[f"ratio_{label}_max"] = head["median"], head["min"], head["max"]
        out[f"baseline_{label}"] = head["baseline"]
        for name, v in head["against"].items():
            out[f"ratio_vs_{name}_{label}"] = v
        out[f"ratio_copy_{label}"] = C.ratio_stats(r["A"], raw[head["baseline"]])["median"]
        for s, key in (("R", "ratio_ray_calls"), ("O", "ratio_object_store"), ("P", "ratio_pipelined"), ("W", "ratio_windowed")):
            out[f"{key}_{label}"] = C.ratio_stats(r[s], raw[head["baseline"]])["median"]
        for s in sides:
            out[f"{SIDES[s][0]}_items_per_s_{label}"] = C.median(r[s])
            out[f"{SIDES[s][0]}_mb_per_s_{label}"] = C.median(r[s]) * nbytes / 1e6
        cells = "  ".join(f"{s} {C.median(r[s]):8.1f} ({C.median(r[s]) * nbytes / 1e6:7.1f})" for s in sides)
        print(f"  {label:>5}  {cells}")
        print(f"         V / {head['baseline']} {C.fmt_ratio(head)}; "
              + ", ".join(f"vs {n} {v:.2f}" for n, v in head["against"].items())
              + f"; A (copies) {out[f'ratio_copy_{label}']:.2f}, R {out[f'ratio_ray_calls_{label}']:.2f}, O {out[f'ratio_object_store_{label}']:.2f}, P {out[f'ratio_pipelined_{label}']:.2f}, "
              f"W {out[f'ratio_windowed_{label}']:.2f}")
    out.update({"ratio": out["ratio_10mb"], "runs": results, "elapsed_s": elapsed})
    prof = out["profile_10mb"]
    per_item = 1e3 / C.median(results["10mb"]["A"])
    print(f"  10 MB item: {per_item:.2f} ms through the channel ({1e3 / C.median(results['10mb']['V']):.2f} ms read as views); parts: encode {prof['encode_ms']:.2f}, decode {prof['decode_ms']:.2f}, "
          f"hops {prof['hops_ms']:.2f} ms (one memcpy {prof['memcpy_ms']:.2f} ms); the compiled graph "
          + (f"{1e3 / C.median(results['10mb']['G']):.2f} ms" if "G" in results["10mb"] else "did not run"))
    print(f"\nratio (channel read as views / fastest raw Ray, both read-only arrays, 10 MB), median of {args.repeats} rounds: {out['ratio_10mb']:.2f} "
          f"[{elapsed:.0f} s; {out['command']}]")
    C.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
