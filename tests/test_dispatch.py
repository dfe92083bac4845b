"""Declared dispatch: a worker method's declaration decides how a group call is split and gathered."""

from __future__ import annotations

import numpy as np
import pytest

from rlweave.cluster import Cluster, GroupPlacement, Worker, WorkerGroup
from rlweave.cluster.dispatch import concat_rows, group_method, row_shards, row_slices


class Echo(Worker):
    """A worker whose methods report what their rank was given."""

    @group_method("all")
    def who(self, tag: str) -> tuple:
        return self.rank, tag

    @group_method("rank0")
    def first(self) -> int:
        return self.rank

    @group_method("shard", collect="concat")
    def double(self, rows: dict) -> dict:
        return {"x": rows["x"] * 2, "rank": np.full(len(rows["x"]), self.rank)}

    @group_method("shard")
    def count(self, items: list) -> int:
        return len(items)

    @group_method("per_rank", blocking=False)
    def take(self, value: int, offset: int = 0) -> int:
        return value + offset + self.rank

    @group_method("peers")
    def ask(self, peer) -> int:
        return peer.result(peer.submit("plain"))[0]

    @group_method("all")
    def plain(self) -> int:
        return 100 + self.rank

    def undeclared(self) -> None:
        return None


def test_row_helpers_split_evenly_and_join_back():
    assert row_slices(5, 2) == [slice(0, 3), slice(3, 5)]
    shares = row_shards({"a": np.arange(5), "b": np.arange(5) * 10}, 2)
    assert shares[1]["b"].tolist() == [30, 40]
    assert concat_rows(shares)["a"].tolist() == [0, 1, 2, 3, 4]
    assert row_shards([1, 2, 3], 3) == [[1], [2], [3]]
    with pytest.raises(ValueError, match="different row counts"):
        row_shards({"a": np.arange(3), "b": np.arange(4)}, 2)


def test_a_bad_declaration_is_refused():
    with pytest.raises(ValueError, match="mode 'scatter'"):
        group_method("scatter")
    with pytest.raises(ValueError, match="collect 'sum'"):
        group_method("all", collect="sum")


@pytest.fixture()
def group():
    cluster = Cluster.start(num_cpus=2, local=True)
    g = WorkerGroup(Echo, GroupPlacement("echo", cluster.slots()[:2]), cluster)
    yield g
    g.shutdown()


def test_group_methods_split_and_gather_as_declared(group):
    assert group.who("t") == [(0, "t"), (1, "t")]
    assert group.first() == 0
    out = group.double({"x": np.arange(5)})
    assert out["x"].tolist() == [0, 2, 4, 6, 8] and out["rank"].tolist() == [0, 0, 0, 1, 1]
    assert group.count(list(range(7))) == [4, 3]
    handle = group.take([10, 20], offset=1)
    assert handle.wait() == [11, 22]
    assert group.ask(group) == [100, 101]


def test_undeclared_methods_and_wrong_arity_name_the_group(group):
    with pytest.raises(AttributeError, match="Echo.undeclared is not a group method"):
        group.undeclared()
    with pytest.raises(ValueError, match="echo.take: 3 per-rank values for 2 ranks"):
        group.take([1, 2, 3])


def test_submit_returns_a_handle_whatever_the_declaration(group):
    handle = group.who.submit("x")
    assert handle.wait() == [(0, "x"), (1, "x")] and handle.results == [(0, "x"), (1, "x")]


class Clash(Worker):
    @group_method("all")
    def shutdown(self) -> None:
        return None


def test_a_group_method_hidden_by_the_group_is_refused():
    cluster = Cluster.start(num_cpus=2, local=True)
    with pytest.raises(TypeError, match="group methods \\['shutdown'\\] would be hidden"):
        WorkerGroup(Clash, GroupPlacement("clash", cluster.slots()[:1]), cluster)


class Hidden(Worker):
    @group_method("all")
    def placement(self) -> None:
        return None


def test_a_group_method_hidden_by_a_groups_own_attribute_is_refused():
    cluster = Cluster.start(num_cpus=2, local=True)
    with pytest.raises(TypeError, match="group methods \\['placement'\\] would be hidden"):
        WorkerGroup(Hidden, GroupPlacement("hidden", cluster.slots()[:1]), cluster)


class Uneven(Worker):
    @group_method("all", collect="concat")
    def rows(self) -> dict:
        return {"a": np.zeros(2)} if self.rank == 0 else {"b": np.zeros(2)}


def test_a_failing_collect_raises_on_every_wait():
    cluster = Cluster.start(num_cpus=2, local=True)
    g = WorkerGroup(Uneven, GroupPlacement("uneven", cluster.slots()[:2]), cluster)
    handle = g.rows.submit()
    for _ in range(2):
        with pytest.raises(KeyError):
            handle.wait()
    g.shutdown()
