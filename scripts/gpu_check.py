"""The CUDA paths of rlweave, checked on a GPU machine in under 8 minutes; one JSON of results.

Run through ``scripts/gpu-check.sh`` (which finds a Python whose torch has CUDA, and says in one
line when the machine has no GPU). Each check runs in a fresh process with its own time limit, so
one that hangs (a NCCL rendezvous, a driver fault) costs its limit and not the whole run; a check
whose limit no longer fits the budget is skipped and says so. The checks:

  nccl_weight_sync   torch.distributed over NCCL on min(2, GPUs) ranks: an all-reduce, then a
                     model's weights broadcast from rank 0; every rank's state-dict checksum
                     (rlweave.models.state_dict_checksum) must equal rank 0's, and rlweave's
                     weight packet (pack_state -> unpack_into -> verify_sync) of CUDA tensors
                     must round-trip.
  lm_fsdp2           ``rlweave train grpo-arith`` with ``actor.strategy=fsdp`` on GPU slots: FSDP2
                     over NCCL, the rollout engine beside it, the runner's weight checksum check
                     every iteration.
  offload_shared     ``rlweave train ppo-cartpole`` with every group on GPU 0: the rollout and the
                     actor offload and onload in turn (``mem/actor_device_mb_*`` in metrics).
  bench_flow         ``bench flow`` on GPU slots: the full bench (one round) with 2+ GPUs; with one
                     GPU, the plans that fit one slot (collocated, auto) run alone.
  bench_grpo         ``bench grpo-vs-trl --device cuda``: rlweave and TRL on GPU, one short round.

    python scripts/gpu_check.py [--out FILE] [--budget-s 470]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK = "GPU-CHECK-RESULT "
LIMITS = {"nccl_weight_sync": 45, "lm_fsdp2": 95, "offload_shared": 75, "bench_flow": 115, "bench_grpo": 115}


# --------------------------------------------------------------------------- the checks (each in its own process)
def _nccl_rank(rank: int, world: int, port: int, out_path: str) -> None:
    import torch
    import torch.distributed as dist

    from rlweave.models import state_dict_checksum
    from rlweave.sync.weights import pack_state, unpack_into, verify_sync

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    x = torch.full((1024,), float(rank + 1), device="cuda")
    dist.all_reduce(x)
    torch.manual_seed(rank)  # every rank starts from other weights
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(6)]).cuda()  # ~100 MB
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for tensor in model.state_dict().values():
        dist.broadcast(tensor, src=0)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    sums = [None] * world
    dist.all_gather_object(sums, state_dict_checksum(model.state_dict()))
    packet = pack_state(model, version=1)
    other = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(6)]).cuda()
    unpack_into(other, packet.buckets)
    verify_sync(packet, [state_dict_checksum(other.state_dict())])
    if rank == 0:
        Path(out_path).write_text(json.dumps({
            "ranks": world, "all_reduce_ok": bool(x[0].item() == world * (world + 1) / 2),
            "broadcast_checksums_equal": len(set(sums)) == 1, "broadcast_s": seconds,
            "broadcast_gb_per_s": sum(t.numel() * t.element_size() for t in model.state_dict().values()) / seconds / 1e9,
            "packet_roundtrip_verified": True, "nccl": ".".join(map(str, torch.cuda.nccl.version()))}))
    dist.destroy_process_group()


def check_nccl_weight_sync(gpus: int) -> dict:
    import socket

    import torch.multiprocessing as mp

    world = min(2, gpus)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = Path(tempfile.mkdtemp(prefix="gpu-check-nccl-")) / "rank0.json"
    mp.spawn(_nccl_rank, args=(world, port, str(out)), nprocs=world, join=True)
    result = json.loads(out.read_text())
    result["ok"] = result["all_reduce_ok"] and result["broadcast_checksums_equal"]
    if world == 1:
        result["note"] = "one GPU: NCCL with one rank (two ranks need two GPUs)"
    return result


def _train(args: list[str], run_dir: Path) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "rlweave.cli", "train", *args, f"run.dir={run_dir}", "run.progress=false",
                           "run.tensorboard=false"], capture_output=True, text=True, env={**os.environ, "RAY_ADDRESS": "local"})
    if proc.returncode != 0:
        raise RuntimeError("rlweave train failed: " + " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:]))
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def check_lm_fsdp2(gpus: int) -> dict:
    sys.path.append(str(ROOT / "benchmarks"))
    from grpo_vs_trl import make_model

    ranks = min(2, gpus)
    tmp = Path(tempfile.mkdtemp(prefix="gpu-check-fsdp-"))
    make_model(tmp / "model", "small")
    rows = _train(["grpo-arith", f"init.checkpoint={tmp / 'model'}", "actor.strategy=fsdp", f"actor.num_workers={ranks}",
                   f"rollout.num_workers={ranks}", "train.total_iterations=3", "train.eval_every=0", "train.checkpoint_every=0",
                   "rollout.prompts_per_iteration=16", "algorithm.group_size=8", "rollout.max_new_tokens=16"], tmp / "run")
    return {"ok": len(rows) >= 3, "ranks": ranks, "iterations": len(rows), "time_iteration_s": [r.get("time/iteration") for r in rows],
            "keys": sorted(k for k in rows[-1] if k.startswith(("time/", "mem/", "sync/")))}


def check_offload_shared(gpus: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="gpu-check-offload-"))
    rows = _train(["ppo-cartpole", "train.total_env_steps=4096", "train.eval_every=0", "train.checkpoint_every=0",
                   "placement.groups.env.slots=0", "placement.groups.rollout.slots=0", "placement.groups.actor.slots=0"], tmp)
    last = rows[-1]
    before, after = last.get("mem/actor_device_mb_before_offload"), last.get("mem/actor_device_mb_after_offload")
    return {"ok": bool(last.get("plan/rollout_offloaded")) and before is not None and after is not None and after < before,
            "iterations": len(rows), "rollout_offloaded": last.get("plan/rollout_offloaded"),
            "actor_device_mb_before_offload": before, "actor_device_mb_after_offload": after}


def _bench(args: list[str]) -> dict:
    out = Path(tempfile.mkdtemp(prefix="gpu-check-bench-")) / "bench.json"
    proc = subprocess.run([sys.executable, *args, "--json", str(out)], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError("bench failed: " + " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:]))
    return json.loads(out.read_text())


def check_bench_flow(gpus: int) -> dict:
    flow = str(ROOT / "benchmarks" / "flow.py")
    if gpus >= 2:
        r = _bench([flow, "--gpus", "2", "--repeats", "1", "--iterations", "4", "--depths", "2,3"])
        return {"ok": True, **{k: r.get(k) for k in ("pipelined_vs_fused_dp", "pipelined_vs_fused_dp_collect",
                                                      "pipelined_vs_collocated", "auto_vs_best", "plan_error")},
                "plans": [{k: p.get(k) for k in ("plan", "micro_batches", "iteration_steps_per_s", "collect_steps_per_s")}
                          for p in r.get("plans", [])]}
    sys.path.append(str(ROOT / "benchmarks"))
    import _common as C

    settings = {"env_id": "HalfCheetah-v5", "envs": 768, "hidden": "1024,1024,1024", "steps": 8, "iterations": 4,
                "slots": 1, "gpus": 1, "seed": 0}
    plans = [C.run_side(flow, "plan", {"settings": settings, "name": name, "k": None}, threads=1) for name in ("collocated", "auto")]
    return {"ok": True, "note": "one GPU: the plans that fit one slot", "plans": [
        {k: p.get(k) for k in ("plan", "micro_batches", "iteration_steps_per_s", "collect_steps_per_s", "planner_choice")} for p in plans]}


def check_bench_grpo(gpus: int) -> dict:
    layouts = "2x1,1x1" if gpus >= 2 else "1x1"
    r = _bench([str(ROOT / "benchmarks" / "grpo_vs_trl.py"), "--device", "cuda", "--layouts", layouts, "--steps", "4", "--warmup-steps", "1",
                "--repeats", "1", "--no-warmup"])
    return {"ok": True, "layouts": layouts, "ratio": r.get("ratio"), "completions_per_s": r.get("completions_per_s"),
            **{k: v for k, v in r.items() if k.startswith("ratio_") and not k.endswith("_stats")}}


CHECKS = {"nccl_weight_sync": check_nccl_weight_sync, "lm_fsdp2": check_lm_fsdp2, "offload_shared": check_offload_shared,
          "bench_flow": check_bench_flow, "bench_grpo": check_bench_grpo}


# --------------------------------------------------------------------------- the driver
def device_info() -> dict:
    import torch

    n = torch.cuda.device_count()
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": n,
            "devices": [{"name": torch.cuda.get_device_name(i), "memory_gb": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1),
                         "capability": ".".join(map(str, torch.cuda.get_device_capability(i)))} for i in range(n)],
            "bf16_native": torch.cuda.is_bf16_supported(including_emulation=False),
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.distributed.is_nccl_available() else None}


def run_check(name: str, gpus: int, limit: float) -> dict:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, __file__, "--check", name, "--gpus", str(gpus)], capture_output=True,
                              text=True, timeout=limit, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {limit:.0f} s", "seconds": time.perf_counter() - t0}
    lines = [x[len(MARK):] for x in proc.stdout.splitlines() if x.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-6:]
        return {"ok": False, "error": " | ".join(tail), "seconds": time.perf_counter() - t0}
    return {**json.loads(lines[-1]), "seconds": round(time.perf_counter() - t0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu-check.json")
    ap.add_argument("--budget-s", type=float, default=470.0, help="the whole run's limit (checks that no longer fit are skipped)")
    ap.add_argument("--only", default=None, help="comma-separated checks to run (default: all)")
    ap.add_argument("--check", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--gpus", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if a.check:
        print(MARK + json.dumps(CHECKS[a.check](a.gpus)), flush=True)
        return 0
    t_start = time.perf_counter()
    info = device_info()
    out = {"check": "gpu", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": info, "results": {}}
    for name in (a.only.split(",") if a.only else CHECKS):
        left = a.budget_s - (time.perf_counter() - t_start)
        if left < 20:
            out["results"][name] = {"ok": None, "skipped": f"time budget ({a.budget_s:.0f} s) spent"}
            continue
        r = run_check(name, info["gpus"], min(LIMITS[name], left))
        out["results"][name] = r
        print(f"gpu-check: {name:<17} {'ok' if r.get('ok') else 'FAILED' if r.get('ok') is False else 'skipped'} "
              f"({r.get('seconds', 0):.0f} s){'  ' + r['error'] if r.get('error') else ''}", flush=True)
    out["seconds"] = round(time.perf_counter() - t_start, 1)
    out["all_ok"] = all(r.get("ok") for r in out["results"].values())
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"gpu-check: {'all checks passed' if out['all_ok'] else 'some checks failed or were skipped'} in {out['seconds']:.0f} s; wrote {a.out}")
    return 0 if out["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
