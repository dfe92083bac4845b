"""Behaviour of rlweave.channel.Channel on both backends (Ray actor and in-process)."""

from __future__ import annotations

import itertools
import os
import pickle
import threading
import time

import numpy as np
import psutil
import pytest
import ray
import torch
from tensordict import TensorDict

from rlweave.channel import Channel, ChannelClosed, ChannelEmpty, ChannelFull, ChannelPayloadLost, Envelope, _shm

BACKENDS = ["local", "ray"]
_ids = itertools.count()


@pytest.fixture(scope="module")
def ray_session():
    # address="local": always a fresh instance, never a `ray start` cluster someone left running here
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def make(request, ray_session):
    """make(backend, maxsize=0, **kw) -> a channel with a fresh name, closed after the test."""
    made = []

    def _make(backend: str, maxsize: int = 0, **kw) -> Channel:
        ch = Channel.create(f"{request.node.originalname[5:35]}-{next(_ids)}", maxsize=maxsize, local=backend == "local", **kw)
        made.append(ch)
        return ch

    yield _make
    for ch in made:
        ch.close()


def wait_until(pred, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


# ----------------------------------------------------------------------------- ordering and keys


@pytest.mark.parametrize("backend", BACKENDS)
def test_fifo_global_and_per_key(make, backend):
    ch = make(backend)
    ch.put("a0", "a")
    ch.put("b0", "b")
    ch.put("a1", "a")
    ch.put("b1", "b")
    ch.put("n0")  # key None is an ordinary key
    assert ch.qsize() == 5 and ch.qsize("a") == 2 and ch.qsize("b") == 2 and ch.qsize("zzz") == 0
    assert ch.get("b") == "b0"  # per-key FIFO
    env = ch.get_envelope()  # globally oldest
    assert isinstance(env, Envelope)
    assert (env.item, env.key, env.seq, env.weight, env.version) == ("a0", "a", 0, 1.0, None)
    assert ch.get("a") == "a1"
    assert [ch.get_envelope().seq for _ in range(2)] == [3, 4]
    assert ch.qsize() == 0
    with pytest.raises(ChannelEmpty):
        ch.get_nowait()


@pytest.mark.parametrize("backend", BACKENDS)
def test_get_batch_by_weight(make, backend):
    ch = make(backend)
    for i, w in enumerate([1, 2, 3]):
        ch.put(f"x{i}", weight=w)
    assert ch.get_batch(3) == ["x0", "x1"]  # 1 + 2 reaches 3: the shortest FIFO prefix
    assert ch.qsize() == 1
    # not enough weight: times out, and the item it took goes back in front
    with pytest.raises(ChannelEmpty, match=r"holds weight 3 of the 4 asked; get_batch timed out after 0.2 s"):
        ch.get_batch(4, timeout=0.2)
    ch.put("x3", weight=1)
    envs = ch.get_batch_envelopes(4)
    assert [(e.item, e.weight) for e in envs] == [("x2", 3.0), ("x3", 1.0)]
    # per key: only that key's items count
    ch.put("k0", "k", weight=0.5)
    ch.put("other", "o", weight=5)
    ch.put("k1", "k", weight=0.5)
    assert ch.get_batch(1.0, "k") == ["k0", "k1"]
    assert ch.get() == "other"
    with pytest.raises(ValueError, match="target_weight"):
        ch.get_batch(0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_get_batch_larger_than_maxsize_keeps_flowing(make, backend):
    # a batch of weight 5 through a channel that holds 2 items: get_batch takes items as they come
    ch = make(backend, maxsize=2)

    def produce():
        for i in range(5):
            ch.put(i, timeout=20)

    t = threading.Thread(target=produce)
    t.start()
    assert ch.get_batch(5, timeout=20) == [0, 1, 2, 3, 4]
    t.join(20)
    assert not t.is_alive()


# ----------------------------------------------------------------------------- backpressure


@pytest.mark.parametrize("backend", BACKENDS)
def test_backpressure_blocks_until_get(make, backend):
    ch = make(backend, maxsize=2)
    ch.put(0, "a")
    ch.put(1, "b")  # maxsize counts across keys
    with pytest.raises(ChannelFull, match=rf"^channel '{ch.name}' is full \(maxsize=2\)$"):
        ch.put_nowait(2, "c")

    done = threading.Event()
    errors = []

    def producer():
        try:
            ch.put(2, "c", timeout=20)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
        done.set()

    t = threading.Thread(target=producer)
    t.start()
    wait_until(lambda: ch.stats()["blocked_puts"] == 1, what="the producer to block")
    assert not done.is_set() and ch.qsize() == 2  # blocked: nothing was added
    assert ch.get() == 0  # frees one slot ...
    assert done.wait(20), "producer still blocked after a get freed space"  # ... which unblocks it
    t.join()
    assert not errors
    assert [ch.get() for _ in range(2)] == [1, 2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_timeout_errors_name_the_channel(make, backend):
    ch = make(backend, maxsize=1)
    with pytest.raises(ChannelEmpty, match=rf"^channel '{ch.name}' is empty; get timed out after 0.1 s$"):
        ch.get(timeout=0.1)
    with pytest.raises(ChannelEmpty, match=rf"^channel '{ch.name}' has no item for key 'k'$"):
        ch.get_nowait("k")
    ch.put("x")
    t0 = time.monotonic()
    with pytest.raises(ChannelFull, match=rf"^channel '{ch.name}' is full \(maxsize=1\); put timed out after 0.2 s$"):
        ch.put("y", timeout=0.2)
    assert time.monotonic() - t0 >= 0.19
    with pytest.raises(ValueError, match="timeout"):
        ch.get(timeout=-1)
    import queue

    with pytest.raises(queue.Full):  # the standard-library exceptions catch these too
        ch.put_nowait("z")


# ----------------------------------------------------------------------------- concurrency


@ray.remote(num_cpus=0)
def _produce(ch: Channel, pid: int, n: int) -> int:
    for i in range(n):
        ch.put((pid, i), key=f"p{pid}", timeout=60)
    return n


def _consume(ch: Channel, got: list) -> None:
    while (env := ch.get_envelope(timeout=60)).item is not None:
        got.append((env.item, env.seq))


def _check_exactly_once(received: list, n_producers: int, n_items: int):
    items = [item for item, _ in received]
    assert len(items) == len(set(items)) == n_producers * n_items
    assert set(items) == {(p, i) for p in range(n_producers) for i in range(n_items)}
    by_seq = sorted(received, key=lambda r: r[1])
    for p in range(n_producers):  # per-producer order preserved in the channel's global order
        assert [i for (q, i), _ in by_seq if q == p] == list(range(n_items))


def test_concurrent_producers_consumers_ray(make):
    ch = make("ray", maxsize=16)
    # producer 0 puts strictly (each put returns once stored); 1 and 2 pipeline up to 4 puts
    handles = [ch, ch.with_put_window(4), ch.with_put_window(4)]
    producers = [_produce.remote(h, p, 200) for p, h in enumerate(handles)]
    per_consumer: list[list] = [[], []]  # two consumer threads in the driver, each with its own handle
    consumers = [threading.Thread(target=_consume, args=(pickle.loads(pickle.dumps(ch)), got)) for got in per_consumer]
    for t in consumers:
        t.start()
    assert ray.get(producers, timeout=120) == [200] * 3
    for _ in consumers:
        ch.put(None, timeout=30)
    for t in consumers:
        t.join(60)
    assert not any(t.is_alive() for t in consumers)
    for got in per_consumer:  # each consumer saw each producer's items in order
        for p in range(3):
            mine = [i for (q, i), _ in got if q == p]
            assert mine == sorted(mine)
    _check_exactly_once([r for got in per_consumer for r in got], 3, 200)
    stats = ch.stats()
    assert stats["puts_inline"] == 602 and stats["puts_by_ref"] == 0 and stats["size"] == 0


def test_pipelined_puts_keep_order_and_backpressure(make):
    ch = make("ray", maxsize=2, put_window=3)
    observer = Channel.connect(ch.name)  # a handle with no puts of its own in flight
    assert observer.put_window == 3
    for i in range(5):  # 2 stored + 3 in flight: none of these waits for a consumer
        ch.put(i)
    done = threading.Event()

    def sixth():
        ch.put(5)  # the window is full and the channel too: this waits
        done.set()

    t = threading.Thread(target=sixth)
    t.start()
    wait_until(lambda: observer.stats()["blocked_puts"] >= 1, what="a put to wait for space")
    assert observer.qsize() == 2 and not done.is_set()
    assert [observer.get(timeout=20) for _ in range(6)] == [0, 1, 2, 3, 4, 5]
    t.join(20)
    assert done.is_set()

    # many pipelined puts (Ray may run them out of order) land in order; read-your-writes on a handle
    ch2 = make("ray", put_window=4)
    for i in range(60):
        ch2.put(i, key=i % 3)
    assert ch2.qsize() == 60  # qsize waits for this handle's puts first
    assert [ch2.get() for _ in range(60)] == list(range(60))


def test_get_window_takes_ready_items_in_one_call_and_keeps_order(make):
    ch = make("ray", maxsize=4)
    reader = ch.with_get_window(3)
    assert reader.get_window == 3 and ch.get_window == 0 and pickle.loads(pickle.dumps(reader)).get_window == 3
    big = np.arange(40_000, dtype=np.int64)  # shared-memory sized: copied out only when handed out
    for i in range(4):
        ch.put(big + i if i == 1 else i, key="a")
    assert reader.get(key="a") == 0  # one call took three items: they have left the channel
    assert ch.qsize() == 1
    ch.put(4, key="a")  # their places are free again: no wait for a consumer
    with pytest.raises(ValueError, match="holds items of key 'a'"):
        reader.get(key="b")
    with pytest.raises(ValueError, match="get window holds 2 item"):
        reader.get_batch(1.0, key="a")
    got = reader.get(key="a")
    assert isinstance(got, np.ndarray) and got.flags.writeable and np.array_equal(got, big + 1)
    assert [reader.get(key="a") for _ in range(3)] == [2, 3, 4]
    with pytest.raises(ChannelEmpty):
        reader.get(key="a", timeout=0.05)
    with pytest.raises(ValueError, match="get_window must be >= 0"):
        ch.with_get_window(-1)
    local = make("local")
    assert local.with_get_window(4) is local


def test_concurrent_producers_consumers_local(make):
    ch = make("local", maxsize=16)
    results: list[list] = [[], []]

    def produce(pid):
        for i in range(200):
            ch.put((pid, i), key=f"p{pid}", timeout=30)

    def consume(j):
        while (env := ch.get_envelope(timeout=30)).item is not None:
            results[j].append((env.item, env.seq))

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(3)]
    threads += [threading.Thread(target=consume, args=(j,)) for j in range(2)]
    for t in threads:
        t.start()
    for t in threads[:3]:
        t.join(30)
    ch.put(None)
    ch.put(None)
    for t in threads[3:]:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    _check_exactly_once(results[0] + results[1], 3, 200)


# ----------------------------------------------------------------------------- versions and payloads


@pytest.mark.parametrize("backend", BACKENDS)
def test_version_carried_through(make, backend):
    ch = make(backend)
    ch.put("plain", version=7)
    ch.put("none")
    td = TensorDict({"obs": torch.arange(4.0), "policy_version": torch.tensor(3)}, batch_size=[])
    ch.put(td)
    per_sample = TensorDict(
        {"obs": torch.zeros(4, 2), "policy_version": torch.tensor([5, 4, 6, 5])}, batch_size=[4]
    )
    ch.put(per_sample)  # a batch is as old as its oldest sample
    ch.put(td, version=9)  # an explicit version wins
    envs = [ch.get_envelope() for _ in range(5)]
    assert [e.version for e in envs] == [7, None, 3, 4, 9]
    assert isinstance(envs[3].item, TensorDict) and envs[3].item.batch_size == torch.Size([4])
    if backend == "ray":  # small items cross the channel actor as opaque bytes
        assert ch.stats()["actor_imported_torch"] is False


def test_items_holding_object_refs(make):
    ch = make("ray")
    ref = ray.put(np.arange(10))
    ch.put({"ref": ref, "step": 1})  # travels as an object so Ray tracks the borrowed reference
    del ref
    got = ch.get(timeout=10)
    assert got["step"] == 1 and np.array_equal(ray.get(got["ref"]), np.arange(10))


@ray.remote(num_cpus=0)
class _Producer:
    def send(self, ch: Channel, nbytes: int) -> int:
        arr = np.arange(nbytes, dtype=np.uint8)
        ch.put(arr, version=1)
        return int(arr.sum())


def test_large_numpy_goes_by_ref(make):
    ch = make("ray", transport="object_store")
    big = np.random.default_rng(0).integers(0, 255, size=8 << 20, dtype=np.uint8)  # 8 MiB
    ch.put(big)
    ch.put({"obs": np.ones((256, 256), np.float32), "t": 3})  # 256 KiB dict of numpy: by ref too
    ch.put(np.zeros(16, np.uint8))  # small: inline
    stats = ch.stats()
    assert (stats["puts_by_ref"], stats["puts_inline"]) == (2, 1)
    out = ch.get()
    assert isinstance(out, np.ndarray) and out.dtype == np.uint8 and np.array_equal(out, big)
    d = ch.get()
    assert d["t"] == 3 and np.array_equal(d["obs"], np.ones((256, 256), np.float32))
    assert np.array_equal(ch.get(), np.zeros(16, np.uint8))
    # from another process: the producer ray.puts, the driver gets it
    p = _Producer.remote()
    checksum = ray.get(p.send.remote(ch, 1 << 20))
    env = ch.get_envelope(timeout=30)
    assert env.version == 1 and int(env.item.sum()) == checksum
    assert ch.stats()["puts_by_ref"] == 3
    ray.kill(p)


# ----------------------------------------------------------------------------- shared-memory transport


@ray.remote(num_cpus=0)
class _ShmProducer:
    def pid(self) -> int:
        return os.getpid()

    def send(self, ch: Channel, nbytes: int, n: int = 1) -> int:
        for i in range(n):
            ch.put({"x": np.full(nbytes, i, dtype=np.uint8), "i": i}, version=i)
        return n


def test_large_numpy_goes_through_shared_memory_on_one_node(make):
    ch = make("ray", maxsize=4)
    assert ch.transport == "shm" and Channel.connect(ch.name).transport == "shm"
    item = {
        "obs": np.arange(64 * 1024, dtype=np.float32).reshape(64, 1024),
        "strided": np.arange(40_000.0)[::2],  # not contiguous: pickled in-band, still exact
        "scalar": np.float64(2.5),
        "note": "meta",
    }
    ch.put(item)
    ch.put(np.zeros(16, np.uint8))  # small: inline
    got = ch.get()
    assert ch.stats()["puts_shm"] == 1 and ch.stats()["puts_inline"] == 1 and ch.stats()["puts_by_ref"] == 0
    assert np.array_equal(got["obs"], item["obs"]) and got["obs"].dtype == np.float32
    assert np.array_equal(got["strided"], item["strided"]) and got["scalar"] == 2.5 and got["note"] == "meta"
    got["obs"][0, 0] = -1.0  # new, writable memory (object-store arrays are read-only views)
    assert item["obs"][0, 0] == 0.0
    assert np.array_equal(ch.get(), np.zeros(16, np.uint8))
    # from another process, several items in flight: every byte and version arrives in order
    p = _ShmProducer.remote()
    done = p.send.remote(ch, 300_000, 12)
    envs = [ch.get_envelope(timeout=30) for _ in range(12)]
    assert ray.get(done) == 12
    assert [e.version for e in envs] == list(range(12))
    assert all(e.item["i"] == i and np.all(e.item["x"] == i) and e.item["x"].size == 300_000 for i, e in enumerate(envs))
    assert ch.stats()["puts_shm"] == 13
    ray.kill(p)


def test_torch_payload_falls_back_to_the_object_store(make):
    ch = make("ray")
    ch.put(torch.arange(100_000, dtype=torch.float32))  # tensors pickle their storage in-band
    assert (ch.stats()["puts_shm"], ch.stats()["puts_by_ref"]) == (0, 1)
    assert torch.equal(ch.get(), torch.arange(100_000, dtype=torch.float32))


def test_shm_failed_put_frees_its_block_and_full_arena_falls_back(make, monkeypatch):
    ch = make("ray", maxsize=1)
    monkeypatch.setattr(_shm, "_arena", _shm.Arena(segment_bytes=4 << 20, max_bytes=4 << 20))
    monkeypatch.setattr(_shm, "_arena_pid", os.getpid())
    arena = _shm.arena()
    big = np.ones(1 << 20, np.uint8)
    ch.put(big)
    with pytest.raises(ChannelFull):
        ch.put_nowait(big)  # written to shared memory, refused by the channel: block given back
    seg = arena.segments[0]
    assert [seg.view[off] for off, _ in seg.live] == [_shm.LIVE, _shm.RELEASED]
    assert np.array_equal(ch.get(), big)
    assert [seg.view[off] for off, _ in seg.live] == [_shm.RELEASED, _shm.RELEASED]
    ch.put(np.ones(8 << 20, np.uint8))  # larger than the arena may grow: object store instead
    assert (ch.stats()["puts_shm"], ch.stats()["puts_by_ref"], arena.fallbacks) == (1, 1, 1)
    assert ch.get().size == 8 << 20
    assert len(arena.segments) == 1


def test_shm_puts_and_get_batch(make, monkeypatch):
    ch = make("ray", maxsize=3)
    monkeypatch.setattr(_shm, "_arena", _shm.Arena(segment_bytes=8 << 20, max_bytes=8 << 20))
    monkeypatch.setattr(_shm, "_arena_pid", os.getpid())
    items = [np.full((256, 1024), i, np.float32) for i in range(3)]  # 1 MiB each
    for i, x in enumerate(items):
        ch.put(x, key="k", weight=2.0, version=10 + i)
    with pytest.raises(ChannelFull):
        ch.put(items[0], block=False)
    envs = ch.get_batch_envelopes(5.0, key="k", timeout=10)
    assert [e.version for e in envs] == [10, 11, 12] and [e.seq for e in envs] == [0, 1, 2]
    assert all(np.array_equal(e.item, x) for e, x in zip(envs, items))
    seg = _shm.arena().segments[0]
    seg._reclaim()  # the three consumed blocks and the refused one are all free again
    assert len(seg.live) == 0 and ch.stats()["puts_shm"] == 3


def test_shm_item_of_a_dead_producer_raises_payload_lost(make):
    ch = make("ray")
    p = _ShmProducer.remote()
    pid = ray.get(p.pid.remote())
    ray.get(p.send.remote(ch, 200_000))
    ray.kill(p)
    wait_until(lambda: not psutil.pid_exists(pid), what=f"producer pid {pid} to exit")
    with pytest.raises(ChannelPayloadLost, match=rf"channel '{ch.name}': item lost, its producing worker process died \(pid {pid}\)") as e:
        ch.get(timeout=10)
    # raised inside a worker, the driver sees a process death: a run with restarts left restarts
    from rlweave.cluster import WorkerError

    assert WorkerError("actor", 0, "train", str(e.value)).process_died


def test_transport_must_be_known(make):
    with pytest.raises(ValueError, match=r"channel 'bad': transport must be one of auto, shm, object_store, got 'nccl'"):
        Channel.create("bad", transport="nccl")


def test_shm_ring_reuses_released_blocks_and_wraps():
    seg = _shm.Segment(1024)
    h = _shm.SEGMENT_HEADER
    a, b, c = seg.alloc(300), seg.alloc(300), seg.alloc(300)
    assert (a, b, c) == (h, h + 300, h + 600)
    assert seg.alloc(100) is None  # 64 + 900 + 100 > 1024
    seg.view[b] = _shm.RELEASED  # out of order: b cannot be reused while a is live
    assert seg.alloc(100) is None
    seg.view[a] = _shm.RELEASED  # a and b reclaimed; the next block wraps to the front
    assert seg.alloc(500) == h and [o for o, _ in seg.live] == [c, h]
    assert seg.alloc(101) is None  # wrapped: only [564, 664) is free
    assert seg.alloc(100) == h + 500
    seg.view[c] = _shm.RELEASED
    seg.view[h] = _shm.RELEASED
    seg.view[h + 500] = _shm.RELEASED
    assert seg.alloc(960) == h and len(seg.live) == 1  # all released: starts over


def test_local_backend_passes_objects_through(make):
    ch = make("local")
    arr = np.zeros(1 << 20, np.uint8)
    ch.put(arr)
    assert ch.get() is arr  # in-process: no copy, no serialisation
    s = ch.stats()
    assert s["backend"] == "local" and s["puts_inline"] == 1 and s["puts_by_ref"] == 0


# ----------------------------------------------------------------------------- names, handles, close


@ray.remote(num_cpus=0)
class _Echo:
    def __init__(self, name: str):
        self.name = name

    def relay(self, ch_in: Channel) -> int:
        out = Channel.connect(self.name)  # look the output channel up by name inside an actor
        n = 0
        while (x := ch_in.get(timeout=30)) is not None:
            out.put(x * 10, key="echo")
            n += 1
        return n


def test_handle_pickles_into_actors_and_connect(make):
    ch_in, ch_out = make("ray"), make("ray", maxsize=3)
    assert Channel.connect(ch_out.name).maxsize == 3
    assert pickle.loads(pickle.dumps(ch_in)).name == ch_in.name
    echo = _Echo.remote(ch_out.name)
    n = echo.relay.remote(ch_in)  # the handle itself travels as an argument
    for i in range(5):
        ch_in.put(i)
    ch_in.put(None)
    assert [ch_out.get("echo", timeout=30) for _ in range(5)] == [0, 10, 20, 30, 40]
    assert ray.get(n) == 5
    ray.kill(echo)


@pytest.mark.parametrize("backend", BACKENDS)
def test_connect_missing_and_duplicate_names(make, backend):
    with pytest.raises(ValueError, match="no channel named 'no-such-channel'"):
        Channel.connect("no-such-channel")
    ch = make(backend)
    with pytest.raises(ValueError, match=rf"channel '{ch.name}' already exists"):
        Channel.create(ch.name, local=backend == "local")
    assert Channel.connect(ch.name).name == ch.name


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_is_idempotent_and_final(make, backend):
    ch = make(backend)
    other = Channel.connect(ch.name)
    ch.put(1)
    ch.close()
    ch.close()
    with pytest.raises(ChannelClosed, match=rf"channel '{ch.name}' is closed"):
        ch.put(2)
    with pytest.raises(ChannelClosed):  # other handles see it too
        other.get(timeout=5)
    wait_until(lambda: _missing(ch.name), what="the name to be released")
    with pytest.raises(ValueError, match=rf"no channel named '{ch.name}'"):
        Channel.connect(ch.name)


def _missing(name: str) -> bool:
    try:
        Channel.connect(name)
        return False
    except ValueError:
        return True


# ----------------------------------------------------------------------------- direct calls to the channel actor


def test_direct_calls_on_one_node_and_ray_calls_give_the_same_channel(make):
    """With the node-local transport, handles reach the channel actor over a Unix socket (fewer
    microseconds of CPU per call); calls="ray" keeps Ray calls. Same items either way, in a worker
    process too; a put of an item holding Ray handles still goes by Ray, and a direct get hands it
    over by a Ray call, so the reference stays valid."""
    direct_ch, ray_ch = make("ray", maxsize=4), make("ray", maxsize=4, calls="ray")
    for ch in (direct_ch, ray_ch):
        ch.put({"x": np.arange(300_000, dtype=np.uint8)}, key="a", version=3)
        ch.put("small", key="b")
        ref = ray.put(np.arange(5))
        ch.put([ref])  # an object holding a Ray handle
        del ref
        got = ch.get_envelope(key="a")
        assert got.version == 3 and np.array_equal(got.item["x"], np.arange(300_000, dtype=np.uint8))
        assert ch.get(key="b") == "small"
        assert np.array_equal(ray.get(ch.get(timeout=10)[0]), np.arange(5))
        p = _ShmProducer.remote()
        assert ray.get(p.send.remote(ch, 200_000, 3)) == 3
        assert [e.item["i"] for e in ch.get_batch_envelopes(3, timeout=10)] == [0, 1, 2]
        ray.kill(p)
    d, r = direct_ch.stats(), ray_ch.stats()
    assert d["calls"] == "direct" and d["direct_calls"] >= 8  # the producer's puts came directly too
    assert r["calls"] == "ray" and r["direct_calls"] == 0


def test_two_handles_in_one_thread_do_not_wait_on_each_other(make):
    """A pipelined put waiting for space must not hold up a get from another handle of the same
    thread: each handle has its own connection."""
    ch = make("ray", maxsize=1)
    producer = ch.with_put_window(2)
    producer.put(0)
    producer.put(1)  # sent; waits in the actor for space
    assert ch.get(timeout=10) == 0 and ch.get(timeout=10) == 1
    producer.flush()


def test_a_key_plain_pickle_cannot_send_goes_by_ray(make):
    class LocalKey(tuple):  # defined in a function: only cloudpickle can send it
        pass

    ch = make("ray")
    ch.put("v", key=LocalKey((1,)))
    assert ch.get(key=LocalKey((1,)), timeout=10) == "v"


def test_calls_must_be_known_and_direct_needs_the_node_local_transport(make):
    with pytest.raises(ValueError, match=r"channel 'c1': calls must be one of auto, direct, ray, got 'grpc'"):
        Channel.create("c1", calls="grpc")
    with pytest.raises(ValueError, match=r"channel 'c2': calls='direct' needs the node-local transport 'shm'"):
        Channel.create("c2", transport="object_store", calls="direct")


@ray.remote(num_cpus=0)
class _PipelinedProducer:
    def send(self, ch: Channel, n: int) -> int:
        for i in range(n):  # returns without flush: the handle (and its connection) goes with the call
            ch.put(np.full(100_000, i, np.uint8), version=i)
        return n


def test_pipelined_puts_of_a_dropped_handle_all_arrive(make):
    ch = make("ray", maxsize=2, put_window=2)
    p = _PipelinedProducer.remote()
    for _ in range(2):  # twice: a second call's handle is a new producer
        assert ray.get(p.send.remote(ch, 4)) == 4  # returns with two puts sent and waiting for space
        assert [int(ch.get(timeout=30)[0]) for _ in range(4)] == list(range(4))
    ray.kill(p)


def test_views_are_read_only_and_free_the_block_when_the_last_one_goes(make):
    ch = make("ray", maxsize=4)
    reader = ch.with_views()
    p = _ShmProducer.remote()
    pid = ray.get(p.pid.remote())
    ray.get(p.send.remote(ch, 500_000, 2))
    first, second = reader.get(timeout=10), ch.get(timeout=10)  # a view, then a copy
    assert np.all(first["x"] == 0) and first["x"].size == 500_000 and not first["x"].flags.writeable
    assert np.all(second["x"] == 1) and second["x"].flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        first["x"][0] = 7
    key = next(k for k in _shm._reader.maps if k[0] == pid)
    view = _shm._reader.maps[key]
    state = lambda: view[64]  # noqa: E731 - the first block's state byte (after the segment header)
    part = first["x"][100:200]
    del first
    assert state() == _shm.LIVE  # a slice of the array still holds the block
    del part
    assert state() == _shm.RELEASED
    assert pickle.loads(pickle.dumps(reader)).views and not Channel.connect(ch.name).views
    ray.kill(p)
