from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from meshshard.partition import Partition, knn_graph, metrics, partition


def _path_graph(n: int):
    r = np.arange(n - 1)
    a = sp.csr_matrix((np.ones(n - 1), (r, r + 1)), shape=(n, n))
    return (a + a.T).tocsr()


def test_metrics_on_a_hand_checked_path():
    # path 0-1-2-3-4-5, shards: {0,1,5} {2,3} {4}; shard 0 is disconnected (0-1 and 5)
    p = Partition.from_assignment([0, 0, 1, 1, 2, 0], 3)
    m = metrics(p, graph=_path_graph(6), points=np.c_[np.arange(6.0), np.zeros(6)])
    assert m["sizes"] == [3, 2, 1]
    assert m["imbalance"] == pytest.approx(1.5) and m["most_overweight_part"] == 0
    assert m["num_edges"] == 5 and m["edge_cut"] == 3  # 1-2, 3-4, 4-5
    # vertices with a foreign neighbour: 1 (->1), 2 (->0), 3 (->2), 4 (->1, ->0), 5 (->2)
    assert m["comm_volume"] == 6
    assert m["halo_sizes"] == [2, 2, 2]  # 0: {2, 4}; 1: {1, 4}; 2: {3, 5}
    assert m["halo_volume"] == 6
    assert m["neighbours"] == [2, 2, 2]
    assert m["components"] == [2, 1, 1] and m["noncontiguous_parts"] == 1
    assert m["bbox_min"][0] == [0.0, 0.0] and m["bbox_max"][0] == [5.0, 0.0]


def test_metrics_brute_force_on_random_cloud():
    pts = np.random.default_rng(0).random((600, 3))
    g = knn_graph(pts, 6)
    part = partition(pts, 5, method="morton", targets=[0.4, 0.15, 0.15, 0.15, 0.15])
    m = metrics(part, graph=g, points=pts, weights=np.ones(600))
    a = part.assignment
    dense = g.toarray().astype(bool)
    cut = sum(dense[i, j] and a[i] != a[j] for i in range(600) for j in range(i + 1, 600))
    assert m["edge_cut"] == cut
    vol = sum(len({a[j] for j in np.flatnonzero(dense[i])} - {a[i]}) for i in range(600))
    assert m["comm_volume"] == vol
    for q in range(5):
        inside = a == q
        halo = np.flatnonzero(dense[inside].any(axis=0) & ~inside)
        assert m["halo_sizes"][q] == halo.size
        lo = pts[inside].min(0)
        assert np.allclose(m["bbox_min"][q], lo)
    assert m["imbalance"] == pytest.approx(1.0, abs=0.01)  # against the targets
    assert m["imbalance_weighted"] == pytest.approx(m["imbalance"])


def test_metrics_empty_parts_and_errors():
    p = Partition.from_assignment([0, 0, 2], 3)
    m = metrics(p, points=np.zeros((3, 3)))
    assert m["empty_parts"] == 1 and m["bbox_min"][1] is None
    with pytest.raises(ValueError, match="points has 2 rows; the partition has N=3"):
        metrics(p, points=np.zeros((2, 3)))
    with pytest.raises(ValueError, match="2 vertices but there are 3 points"):
        metrics(p, graph=_path_graph(2))


def test_the_removed_method_says_where_metrics_went():
    p = Partition.from_assignment([0, 1], 2)
    with pytest.raises(AttributeError, match=r"meshshard.partition.metrics\(part"):
        p.metrics()
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        p.nope  # noqa: B018
