"""Cluster resources made on first use keep the solver tie-break order of an up-front build."""

import pytest

from hwmodel.cluster import Cluster
from hwmodel.topology import build_system


def test_indexes_are_the_up_front_order_whatever_is_touched_first():
    topo = build_system("dgx-h100", 3, su_size=2)
    cl = Cluster(topo, record=False)
    edges = list(topo.graph.edges())
    last = edges[-1]
    assert cl.links[last].index == len(edges) - 1  # touched first, still indexed last among links
    assert cl.gpus["n2.gpu7"].hbm.index == len(edges) + 2 * 23 + 1
    assert cl.gpus["n0.gpu0"].sm.index == len(edges)
    assert [r.index for r in cl.link_resources()] == [len(edges) - 1]  # only what was made
    assert [cl.links[e].index for e in edges] == list(range(len(edges)))
    assert len(cl.links) == len(edges) and len(cl.gpus) == 24


def test_a_transfer_makes_only_the_links_of_its_route():
    cl = Cluster(build_system("dgx-a100", 64), record=False)
    cl.transfer("n0.gpu0", "n63.gpu5", 1e6)
    cl.env.run()
    made = cl.link_resources()
    assert [r.index for r in made] == sorted(r.index for r in made)  # topology edge order
    assert len(made) == len(cl.topology.route("n0.gpu0", "n63.gpu5"))
    assert all(r.carried == pytest.approx(1e6, rel=1e-12) for r in made)
    assert "n0.gpu0" in cl.gpus and "n64.gpu0" not in cl.gpus and ("n0.gpu0", "nowhere") not in cl.links
