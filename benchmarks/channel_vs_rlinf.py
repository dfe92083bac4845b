"""rlweave's worker groups and Channel against RLinf's, side by side in one run.

Two measurements, each made the same way on both sides:

* **call latency**: the driver calls a no-op method on every rank of a worker group (``--workers``
  processes) and waits for all results, one call after another. rlweave: ``group.call(...).wait()``;
  RLinf: ``group.method().wait()`` (a ``WorkerGroupFuncResult``).
* **worker -> worker transfer**: a producer worker group (one process) puts ``--mb`` MB items into
  a channel (``maxsize=DEPTH``) and a consumer worker group (one process) gets them; the driver
  starts both calls and times until both have returned. Four configurations per side: the item is
  a numpy ``uint8`` array or a torch ``uint8`` tensor (the same bytes), and the producer waits for
  each put to be stored (``acked``) or keeps up to ``DEPTH/2`` puts in flight (``pipelined``:
  rlweave ``with_put_window``, RLinf ``put(..., async_op=True)``). rlweave's channel uses its
  default transport (shared memory on one node); RLinf's channel is a channel worker that its
  workers send to and receive from over their collective groups (gloo on CPU).

Each side runs in its own process with one environment (:func:`_common.side_env`): rlweave from
this interpreter, RLinf from ``.venv-rlinf`` (``bash scripts/setup.sh rlinf``; its own Ray, same
version), each with an embedded Ray of its own on this machine, CPU only. A discarded warm-up run of
each side finds how many calls / items give >= 1 s of timed work; then rounds in A B, B A, ...
order. Headline: ``ratio_10mb`` = rlweave's fastest transfer configuration / RLinf's fastest
(median over rounds of the per-round ratio; > 1: rlweave moves more MB/s), ``ratio_call`` = RLinf's
call latency / rlweave's (> 1: rlweave's calls are quicker). The ratio of every configuration
against its same-named counterpart is written beside them.

    rlweave bench channel-vs-rlinf [--json FILE] [--repeats 3] [--workers 2] [--mb 10]
"""

from __future__ import annotations

import collections
import importlib.metadata
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent))  # `rlweave bench` loads this file by path
import _common as C  # noqa: E402

DEPTH = 4  # channel maxsize on both sides; pipelined puts keep DEPTH // 2 in flight
CONFIGS = {  # name -> (payload kind, put window)
    "numpy_acked": ("numpy", 0), "numpy_pipelined": ("numpy", DEPTH // 2),
    "torch_acked": ("torch", 0), "torch_pipelined": ("torch", DEPTH // 2),
}
START = {"calls": 32, "items": 4}  # first guesses; the warm-up run doubles them to >= 1 s of work
RLINF_PYTHON = Path(__file__).resolve().parent.parent / ".venv-rlinf" / "bin" / "python"
SIDE_LIBRARIES = {"rlweave": ("rlweave", "ray", "torch", "numpy"), "rlinf": ("rlinf", "ray", "torch", "numpy")}


# --------------------------------------------------------------------------- work, shared by both sides
_PAYLOADS: dict[tuple[str, int], Any] = {}


def payload(kind: str, nbytes: int):
    """The item a producer puts: random bytes as a numpy array, or a torch tensor over the same
    memory. Made once per process, so the timed loop moves bytes and makes none."""
    key = (kind, nbytes)
    if key not in _PAYLOADS:
        import numpy as np

        arr = _PAYLOADS.setdefault(("numpy", nbytes), np.random.default_rng(0).integers(0, 255, size=nbytes, dtype=np.uint8))
        if kind == "torch":
            import torch

            _PAYLOADS[key] = torch.from_numpy(arr)
    return _PAYLOADS[key]


def check(item, nbytes: int) -> None:
    """The same cheap check of every received item on both sides."""
    got = item.nbytes if hasattr(item, "nbytes") else item.numel() * item.element_size()
    if got != nbytes:
        raise AssertionError(f"received {got} bytes, expected {nbytes}")


def process_info() -> dict:
    """What a worker process actually had: pid, torch threads, thread-related environment."""
    import torch

    return {"pid": os.getpid(), "torch_threads": torch.get_num_threads(),
            "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MALLOC_ARENA_MAX")}}


class BenchEnds:
    """The worker methods both libraries' worker classes share (mixed into each one's Worker)."""

    def bench_noop(self) -> None:
        return None

    def bench_info(self) -> dict:
        return process_info()

    def bench_consume(self, ch, nbytes: int, n: int) -> int:
        for _ in range(n):
            check(self.bench_get(ch), nbytes)
        return n

    def bench_produce(self, ch, kind: str, nbytes: int, n: int, window: int) -> int:
        item = payload(kind, nbytes)
        self.bench_put_all(ch, item, n, window)
        return n


# --------------------------------------------------------------------------- the two sides
class RlweaveSide:
    """rlweave: three worker groups (callees, producer, consumer) and a Ray channel."""

    def start(self, workers: int) -> dict:
        from rlweave.channel import Channel
        from rlweave.cluster import Cluster, GroupPlacement, Worker, WorkerGroup

        class RlweaveEnds(BenchEnds, Worker):
            def bench_get(self, ch):
                return ch.get(timeout=300)

            def bench_put_all(self, ch, item, n: int, window: int) -> None:
                h = ch.with_put_window(window) if window else ch
                for _ in range(n):
                    h.put(item)
                h.flush()

        self.cluster = Cluster.start()
        slots = self.cluster.slots()
        group = lambda name, idx: WorkerGroup(RlweaveEnds, GroupPlacement(name, [slots[i % len(slots)] for i in idx]), self.cluster)
        self.callees = group("bench-callees", range(workers))
        self.producer, self.consumer = group("bench-producer", [0]), group("bench-consumer", [1])
        self.ch = Channel.create(f"bench-vs-rlinf-{os.getpid()}", maxsize=DEPTH)
        self.ch.qsize()
        return {"transport": self.ch.transport, "peer_calls": self.cluster.peer_calls,
                "workers": {g.name: g.run("bench_info") for g in (self.callees, self.producer, self.consumer)}}

    def call(self) -> None:
        self.callees.call("bench_noop").wait()

    def transfer(self, kind: str, nbytes: int, n: int, window: int) -> None:
        p = self.producer.call("bench_produce", self.ch, kind, nbytes, n, window)
        c = self.consumer.call("bench_consume", self.ch, nbytes, n)
        p.wait(), c.wait()

    def close(self) -> None:
        self.ch.close()
        for g in (self.callees, self.producer, self.consumer):
            g.shutdown()
        self.cluster.shutdown()


class RlinfSide:
    """RLinf 0.3: its ``Cluster`` (embedded Ray, CPU node), three worker groups placed with
    ``NodePlacementStrategy`` and a ``Channel`` (a channel worker on node 0)."""

    def start(self, workers: int) -> dict:
        os.environ.setdefault("RLINF_LOG_LEVEL", "WARNING")  # read when rlinf is imported
        from rlinf.scheduler import Channel, Cluster, NodePlacementStrategy, Worker

        class RlinfEnds(BenchEnds, Worker):
            def __init__(self):
                Worker.__init__(self)

            def bench_get(self, ch):
                return ch.get()

            def bench_put_all(self, ch, item, n: int, window: int) -> None:
                if not window:
                    for _ in range(n):
                        ch.put(item)
                    return
                works: collections.deque = collections.deque()
                for _ in range(n):
                    works.append(ch.put(item, async_op=True))
                    if len(works) > window:
                        works.popleft().wait()
                while works:
                    works.popleft().wait()

        import ray

        self.cluster = Cluster(num_nodes=1)
        group = lambda name, n: RlinfEnds.create_group().launch(self.cluster, placement_strategy=NodePlacementStrategy([0] * n), name=name)
        self.callees = group("bench-callees", workers)
        self.producer, self.consumer = group("bench-producer", 1), group("bench-consumer", 1)
        self.ch = Channel.create(f"bench-vs-rlinf-{os.getpid()}", maxsize=DEPTH)
        self.ch.qsize()
        self._ray = ray
        return {"num_accelerators": self.cluster.num_accelerators, "namespace": Cluster.NAMESPACE,
                "workers": {n: g.bench_info().wait() for n, g in
                            (("bench-callees", self.callees), ("bench-producer", self.producer), ("bench-consumer", self.consumer))}}

    def call(self) -> None:
        self.callees.bench_noop().wait()

    def transfer(self, kind: str, nbytes: int, n: int, window: int) -> None:
        p = self.producer.bench_produce(self.ch, kind, nbytes, n, window)
        c = self.consumer.bench_consume(self.ch, nbytes, n)
        p.wait(), c.wait()

    def close(self) -> None:
        if self._ray.is_initialized():
            self._ray.shutdown()


SIDE_CLASSES = {"rlweave": RlweaveSide, "rlinf": RlinfSide}


def timed_calls(side, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        side.call()
    return time.perf_counter() - t0


def timed_transfer(side, cfg: str, nbytes: int, n: int) -> float:
    kind, window = CONFIGS[cfg]
    t0 = time.perf_counter()
    side.transfer(kind, nbytes, n, window)
    return time.perf_counter() - t0


def run_one_side(name: str, workers: int, nbytes: int, min_seconds: float, counts: dict | None = None) -> dict:
    """One side's process: start its runtime, warm every path up, then time ``counts`` calls and
    items per configuration (found here, doubling until >= ``min_seconds``, when not given)."""
    side = SIDE_CLASSES[name]()
    t0 = time.perf_counter()
    effective = side.start(workers)
    startup_s = time.perf_counter() - t0
    try:
        timed_calls(side, 8)
        for cfg in CONFIGS:  # first transfers set up connections (RLinf: its collective groups)
            timed_transfer(side, cfg, nbytes, 2)
        counts = dict(counts or {})
        if "calls" not in counts:
            counts["calls"] = C.grow_until(lambda k: timed_calls(side, k), START["calls"], 1.5 * min_seconds)
        for cfg in CONFIGS:
            if cfg not in counts:
                counts[cfg] = C.grow_until(lambda k, cfg=cfg: timed_transfer(side, cfg, nbytes, k), START["items"], 1.5 * min_seconds)
        call_s = timed_calls(side, counts["calls"])
        transfer_s = {cfg: timed_transfer(side, cfg, nbytes, counts[cfg]) for cfg in CONFIGS}
    finally:
        side.close()
    versions = {}
    for lib in SIDE_LIBRARIES[name]:
        try:
            versions[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            versions[lib] = None
    return {"counts": counts, "startup_s": startup_s, "call_us": call_s / counts["calls"] * 1e6,
            "mb_per_s": {cfg: counts[cfg] * nbytes / s / 1e6 for cfg, s in transfer_s.items()},
            "timed_s": min([call_s, *transfer_s.values()]), "python": sys.executable, "versions": versions,
            "effective": effective}


# --------------------------------------------------------------------------- orchestration
def rlinf_ready(python: Path) -> str | None:
    """None when ``python`` imports RLinf's scheduler, else the one-line reason."""
    if not python.is_file():
        return f"{python} not found: run `bash scripts/setup.sh rlinf` (RLinf lives in an environment of its own)"
    proc = subprocess.run([str(python), "-c", "import rlinf.scheduler"], capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["(no output)"]
        return f"{python} cannot import rlinf.scheduler: {last[0]}"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = C.paired_parser("rlweave bench channel-vs-rlinf", __doc__)
    ap.add_argument("--workers", type=int, default=2, help="processes of the called worker group")
    ap.add_argument("--mb", type=float, default=10.0, help="item size of the transfer, MB (2**20 bytes)")
    ap.add_argument("--min-seconds", type=float, default=C.MIN_TIMED_S, help="least timed work per measurement")
    ap.add_argument("--rlinf-python", default=str(RLINF_PYTHON), help="interpreter of RLinf's environment")
    args = ap.parse_args(argv)
    nbytes = int(args.mb * (1 << 20))
    if args.side:
        return C.serve_side(lambda **p: run_one_side(args.side, **p), args.side_params)
    if args.repeats < 1 or args.workers < 1 or nbytes < 1:
        print("rlweave bench channel-vs-rlinf: --repeats, --workers and --mb must be positive", file=sys.stderr)
        return 2
    rlinf_python = Path(args.rlinf_python)
    reason = rlinf_ready(rlinf_python)
    if reason:
        print(f"rlweave bench channel-vs-rlinf: RLinf side cannot run: {reason}", file=sys.stderr)
        return 1
    label = f"{args.mb:g}mb".replace(".", "_")
    base = {"workers": args.workers, "nbytes": nbytes, "min_seconds": args.min_seconds}
    params = {"rlweave": dict(base), "rlinf": dict(base)}
    launchers = {"rlweave": [sys.executable], "rlinf": [str(rlinf_python)]}

    def side_fn(name: str):
        def run() -> dict:
            r = C.run_side(__file__, name, params[name], args.threads, launcher=launchers[name], timeout=900)
            params[name].setdefault("counts", r["counts"])  # the warm-up's counts, for every measured run
            return r
        return run

    configs = {
        "rlweave": {"library": "rlweave", "python": sys.executable, "channel": f"rlweave.channel.Channel maxsize={DEPTH}, transport auto",
                    "groups": "rlweave.cluster.WorkerGroup; calls: group.call(...).wait()",
                    "pipelined_put": f"with_put_window({DEPTH // 2})"},
        "rlinf": {"library": "rlinf", "python": str(rlinf_python), "channel": f"rlinf.scheduler.Channel maxsize={DEPTH} (channel worker, node 0)",
                  "groups": "rlinf Worker.create_group().launch(NodePlacementStrategy); calls: group.method().wait()",
                  "pipelined_put": f"put(async_op=True), {DEPTH // 2} in flight"},
    }
    for cfg in configs.values():
        cfg.update(workers_called=args.workers, item_bytes=nbytes, payloads="numpy uint8 / torch uint8 (same bytes)")
    out = C.report("channel-vs-rlinf", argv, f"worker->worker MB/s at {args.mb:g} MB and group call latency, rlweave / RLinf",
                   configs, args.repeats, threads=args.threads)
    load_start = C.load_average()
    print(f"channel-vs-rlinf: {args.mb:g} MB items producer worker -> consumer worker, no-op calls on {args.workers} workers")
    print(f"  {out['environment']['cpu_model']}, {out['environment']['cpus']} cpus, load {load_start}; "
          f"order: {' | '.join(out['protocol']['order'])}")
    t0 = time.perf_counter()
    warmups, runs = C.interleave({name: side_fn(name) for name in params}, args.repeats,
                                 describe=lambda n, r: f"call {r['call_us']:.0f} us; " + ", ".join(
                                     f"{k} {v:.0f} MB/s" for k, v in r["mb_per_s"].items()))
    elapsed = time.perf_counter() - t0
    mbs = {name: {cfg: [r["mb_per_s"][cfg] for r in rs] for cfg in CONFIGS} for name, rs in runs.items()}
    best = {name: C.fastest(mbs[name]) for name in mbs}
    head = C.ratio_stats(mbs["rlweave"][best["rlweave"]], mbs["rlinf"][best["rlinf"]])
    call_us = {name: [r["call_us"] for r in rs] for name, rs in runs.items()}
    call = C.ratio_stats(call_us["rlinf"], call_us["rlweave"])
    out.update({
        f"ratio_{label}": head["median"], f"ratio_{label}_min": head["min"], f"ratio_{label}_max": head["max"],
        "ratio": head["median"], "best_config": best,
        "ratio_call": call["median"], "ratio_call_min": call["min"], "ratio_call_max": call["max"],
        "call_us_median": {name: C.median(v) for name, v in call_us.items()},
        "mb_per_s_median": {name: {cfg: C.median(v) for cfg, v in per.items()} for name, per in mbs.items()},
        "ratio_same_config": {cfg: C.ratio_stats(mbs["rlweave"][cfg], mbs["rlinf"][cfg])["median"] for cfg in CONFIGS},
        "settings": {"depth": DEPTH, "configs": {k: {"payload": p, "put_window": w} for k, (p, w) in CONFIGS.items()},
                     "counts": {name: p.get("counts") for name, p in params.items()}, "threads": args.threads},
        "side_versions": {name: rs[0]["versions"] for name, rs in runs.items()},
        "effective": {name: rs[0]["effective"] for name, rs in runs.items()},
        "startup_s_median": {name: C.median([r["startup_s"] for r in rs]) for name, rs in runs.items()},
        "load_avg_1m": {"start": load_start, "end": C.load_average()},
        "runs": runs, "warmups": warmups, "elapsed_s": elapsed,
    })
    print("\nmedians over rounds, MB/s")
    for cfg in CONFIGS:
        a, b = out["mb_per_s_median"]["rlweave"][cfg], out["mb_per_s_median"]["rlinf"][cfg]
        print(f"  {cfg:<16} rlweave {a:8.1f}  rlinf {b:8.1f}  ratio {out['ratio_same_config'][cfg]:.2f}")
    print(f"  call latency    rlweave {out['call_us_median']['rlweave']:.0f} us  rlinf {out['call_us_median']['rlinf']:.0f} us  "
          f"ratio {C.fmt_ratio(call)}")
    print(f"\nratio_{label} (rlweave {best['rlweave']} / rlinf {best['rlinf']}): {C.fmt_ratio(head)}; "
          f"ratio_call {call['median']:.2f} [{elapsed:.0f} s; load {load_start} -> {out['load_avg_1m']['end']}]")
    C.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
