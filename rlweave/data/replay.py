"""Replay data: n-step transition writing (env side) and the replay buffer.

Transitions are flat and self-contained: ``obs, action, reward, next_obs, discount`` (plus the
``policy_version`` that acted), where ``reward`` is the k-step discounted sum and
``discount = gamma**k * (1 - terminated)``, k <= n. The env worker folds n-step returns in as it
writes (:class:`NStepWriter`: it alone sees each env's consecutive steps), so the buffer stores
online data and offline datasets the same way and the losses never see episode boundaries.

The buffer keeps one ring per *source* (``online``, an offline dataset, ...) and samples a batch
that mixes sources at fixed ratios (RLPD's symmetric sampling is ``{"offline": .5, "online": .5}``).
The replay shard worker that holds a buffer is :class:`~rlweave.workers.replay.ReplayBufferWorker`.
"""

from __future__ import annotations

from collections import deque

import numpy as np

__all__ = ["TRANSITION_KEYS", "NStepWriter", "ReplayBuffer"]

TRANSITION_KEYS = ("obs", "action", "reward", "next_obs", "discount", "policy_version")


class NStepWriter:
    """Turns per-step data of ``num_envs`` envs into n-step transitions.

    A transition starting at step t of env i is emitted once n rewards are in, or earlier when the
    episode ends (then it bootstraps from the final observation with gamma**k, or not at all if the
    episode terminated). Steps still waiting for their n rewards stay in :attr:`pending`, which is
    part of the env worker's state."""

    def __init__(self, n: int, gamma: float, num_envs: int):
        if n < 1:
            raise ValueError(f"algorithm.n_step: must be >= 1, got {n}")
        self.n, self.gamma, self.num_envs = int(n), float(gamma), int(num_envs)
        self.pending: list[deque] = [deque() for _ in range(self.num_envs)]
        self._out: list[dict[str, np.ndarray]] = []

    def add(self, obs, action, reward, next_obs, terminated, done, version: int, keep: np.ndarray | None = None) -> None:
        """One step of every env: ``next_obs`` is the observation the step reached (the final one
        when the episode ended there), ``done`` = terminated or truncated. ``keep`` (one-step only):
        store just these envs' transitions (HG-DAgger keeps the steps the expert took over)."""
        reward = np.asarray(reward, dtype=np.float32)
        terminated = np.asarray(terminated, dtype=bool)
        if self.n == 1:  # every step is a finished transition
            rows = slice(None) if keep is None else np.asarray(keep, dtype=bool)
            self._out.append({
                "obs": np.asarray(obs)[rows], "action": np.asarray(action)[rows], "reward": reward[rows],
                "next_obs": np.asarray(next_obs)[rows], "discount": (self.gamma * (~terminated)).astype(np.float32)[rows],
                "policy_version": np.full(len(reward), version, dtype=np.int64)[rows],
            })
            return
        if keep is not None:
            raise ValueError("NStepWriter: keeping a subset of steps needs one-step transitions (algorithm.n_step=1)")
        rows: list[tuple] = []
        for i in range(self.num_envs):
            q = self.pending[i]
            q.append([obs[i], action[i], version, 0.0, 0])
            for entry in q:
                entry[3] += (self.gamma ** entry[4]) * float(reward[i])
                entry[4] += 1
            if done[i]:
                while q:
                    rows.append((q.popleft(), next_obs[i], bool(terminated[i])))
            elif q[0][4] == self.n:
                rows.append((q.popleft(), next_obs[i], False))
        if rows:
            self._out.append({
                "obs": np.stack([e[0] for e, _, _ in rows]),
                "action": np.stack([e[1] for e, _, _ in rows]),
                "reward": np.array([e[3] for e, _, _ in rows], dtype=np.float32),
                "next_obs": np.stack([o for _, o, _ in rows]),
                "discount": np.array([0.0 if term else self.gamma ** e[4] for e, _, term in rows], dtype=np.float32),
                "policy_version": np.array([e[2] for e, _, _ in rows], dtype=np.int64),
            })

    def pop(self) -> dict[str, np.ndarray] | None:
        """Every finished transition since the last call, concatenated (None if there is none)."""
        out, self._out = self._out, []
        if not out:
            return None
        return {k: np.concatenate([np.asarray(o[k]) for o in out]) for k in TRANSITION_KEYS}

    def state_dict(self) -> dict:
        return {"n": self.n, "pending": [list(map(list, q)) for q in self.pending]}

    def load_state_dict(self, state: dict) -> None:
        self.pending = [deque(list(e) for e in q) for q in state["pending"]]


class _Ring:
    """Fixed-capacity FIFO of transitions (numpy arrays allocated at the first insert)."""

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.data: dict[str, np.ndarray] = {}
        self.pos = 0
        self.size = 0
        self.added = 0  # transitions ever inserted

    def add(self, batch: dict[str, np.ndarray]) -> None:
        n = len(batch["reward"])
        if not self.data:
            self.data = {k: np.zeros((self.capacity, *np.shape(v)[1:]), dtype=np.asarray(v).dtype) for k, v in batch.items()}
        if n > self.capacity:  # only the newest fit
            batch = {k: np.asarray(v)[-self.capacity:] for k, v in batch.items()}
            n = self.capacity
        idx = (self.pos + np.arange(n)) % self.capacity
        for k, v in batch.items():
            self.data[k][idx] = v
        self.pos = int((self.pos + n) % self.capacity)
        self.size = min(self.capacity, self.size + n)
        self.added += n

    def state_dict(self) -> dict:
        return {"capacity": self.capacity, "pos": self.pos, "size": self.size, "added": self.added,
                "data": {k: v[: self.size].copy() if self.size < self.capacity else v for k, v in self.data.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.capacity, self.pos, self.size, self.added = state["capacity"], state["pos"], state["size"], state["added"]
        self.data = {}
        for k, v in state["data"].items():
            arr = np.zeros((self.capacity, *v.shape[1:]), dtype=v.dtype)
            arr[: len(v)] = v
            self.data[k] = arr


class ReplayBuffer:
    """Uniform replay over one ring per source, mixed at fixed ratios.

    ``mix`` maps source name -> share of each batch (normalised; sources absent from ``mix`` are
    stored but not sampled). A batch of B takes ``round(B * share)`` rows from each source (the
    last source takes the remainder)."""

    def __init__(self, capacity: int, seed: int, mix: dict[str, float] | None = None, transient: tuple[str, ...] = ()):
        self.capacity = int(capacity)
        self.rings: dict[str, _Ring] = {}
        self.rng = np.random.default_rng(seed)
        self.mix = dict(mix or {"online": 1.0})
        # sources re-read from their files at every start (offline datasets): not written into checkpoints
        self.transient = set(transient)

    def add(self, batch: dict[str, np.ndarray], source: str = "online", capacity: int | None = None) -> None:
        if source not in self.rings:
            self.rings[source] = _Ring(capacity or self.capacity)
        self.rings[source].add(batch)

    def size(self, source: str | None = None) -> int:
        if source is not None:
            return self.rings[source].size if source in self.rings else 0
        return sum(r.size for r in self.rings.values())

    def sample(self, batch_size: int, num_batches: int = 1) -> dict[str, np.ndarray]:
        """``num_batches`` batches of ``batch_size`` at once: arrays [num_batches, batch_size, ...]."""
        total = sum(self.mix.values())
        names = [s for s in self.mix if self.mix[s] > 0]
        counts, left = [], batch_size
        for j, s in enumerate(names):
            c = left if j == len(names) - 1 else int(round(batch_size * self.mix[s] / total))
            counts.append(c)
            left -= c
        parts = []
        for s, c in zip(names, counts):
            ring = self.rings.get(s)
            if ring is None or ring.size == 0:
                raise RuntimeError(f"replay: source '{s}' is empty, cannot sample from it")
            idx = self.rng.integers(0, ring.size, size=(num_batches, c))
            parts.append({k: v[idx] for k, v in ring.data.items()})
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts], axis=1) for k in parts[0]}

    def state_dict(self) -> dict:
        rings = {s: r.state_dict() for s, r in self.rings.items() if s not in self.transient}
        return {"rings": rings, "rng": self.rng.bit_generator.state, "mix": self.mix}

    def load_state_dict(self, state: dict) -> None:
        """Restores the checkpointed sources; transient ones already loaded stay as they are."""
        self.rings = {s: r for s, r in self.rings.items() if s in self.transient}
        for s, rs in state["rings"].items():
            ring = _Ring(rs["capacity"])
            ring.load_state_dict(rs)
            self.rings[s] = ring
        self.rng.bit_generator.state = state["rng"]
        self.mix = dict(state["mix"])
