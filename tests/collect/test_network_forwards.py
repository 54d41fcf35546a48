"""Networks of a multi-optimizer model (``_collect/network_forwards.py``) and each optimizer's own
update (``_collect/probes/updates.py``)."""

from __future__ import annotations

import torch
from torch import nn

import torch_sentinel
from torch_sentinel._collect.network_forwards import network_of
from torch_sentinel._collect.probes.updates import UpdateNorms


def test_a_network_is_the_largest_module_holding_only_its_optimizers_parameters() -> None:
    owner = {"encoder.convnet.0.weight": "encoder.convnet.0", "encoder.convnet.2.weight": "encoder.convnet.2",
             "critic.q.0.weight": "critic.q.0", "critic.trunk.0.weight": "critic.trunk.0"}
    enc = ["encoder.convnet.0.weight", "encoder.convnet.2.weight"]
    critic = ["critic.q.0.weight", "critic.trunk.0.weight"]
    assert network_of(enc, owner, critic) == "encoder"
    assert network_of(critic, owner, enc) == "critic"
    assert network_of(enc + critic, owner, []) == ""
    assert network_of(["critic.q.0.weight"], owner, ["critic.trunk.0.weight"]) == "critic.q"


def test_each_optimizers_update_is_measured_on_its_own_parameters() -> None:
    """Issue 25: with two optimizers over one container, the update slots held only the last
    optimizer's step (the others read 0), and the ratio mixed one network's update with both
    networks' weights. Every network's update is measured now."""
    torch.manual_seed(0)
    G, D = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1))
    opt_d, opt_g = torch.optim.Adam(D.parameters(), lr=1e-3), torch.optim.Adam(G.parameters(), lr=1e-3)
    with torch_sentinel.attach(nn.ModuleDict({"G": G, "D": D}), [opt_d, opt_g], update_every=2) as s:
        for _ in range(4):
            fake = G(torch.randn(16, 4))
            D.zero_grad()
            (D(torch.randn(16, 2)).mean() - D(fake.detach()).mean()).backward()
            opt_d.step()
            G.zero_grad()
            (-D(fake).mean()).backward()
            opt_g.step()
        sampled = [r for r in s.recent_records() if r.fact(UpdateNorms) is not None]
        assert sampled
        for rec in sampled:
            upd = rec.fact(UpdateNorms)
            assert upd is not None
            by = upd.by_name()
            assert by["D.0.weight"] > 0 and by["G.0.weight"] > 0, by
