"""Cases for ``test_view.py``: views splitting a sharded dim (the rows that change owner move;
by whole rows on one or two mesh dims), against one process (run by
:mod:`tests.shardtensor._rule_cases`, which describes a case)."""

from __future__ import annotations

import torch

from tests.shardtensor._rule_cases import R, case, probe


@case("view", "view_split_sharded_dim", seed=1023, extras=[(R, (2, 5, "N"), True)], mesh2d=False)
def _c(x, w):
    n = x.shape[1]
    y = x.reshape(2, n * 5).view(2, 5, n)  # rows of n elements: shard boundaries move
    return y * w, (y * w).reshape(2, n, 5) + x, y.sum(2)


@case("view", "view_split_whole_rows", seed=2009, plain_grads=True,
      extras=[(R, (1, 3, 1, 1), True)])
def _c(x, w):
    n = x.shape[1]
    h = x.unsqueeze(1).expand(2, 3, n, 5) * w  # (B, H, N, D)
    m = h.reshape(6, n, 5)  # B*H: sharded where the batch is (sizes * 3)
    back = (m * 2).reshape(2, 3, n, 5)  # split by whole rows, on every mesh dim at once
    t = x.unsqueeze(2).expand(2, n, 4, 5).reshape(2, n * 4, 5)  # N*4: sizes * 4
    return back.sum(1), m.reshape(2, 3, n * 5), t.sin().reshape(2, n, 4, 5).sum(2)


@probe("view", "merge two sharded dims", "NotImplementedError: aten.view.default: (2, 8, 5) -> "
       "(16, 5) merges dims sharded on two mesh dims", on="2d", prefix=True)
def _(ctx):
    """On the 2-D mesh: a view merging the batch (one mesh dim) with the points (the other)
    into one dim has no layout (one mesh dim per tensor dim)."""
    ctx.sample()[1].reshape(2 * ctx.n, 5)


def reshape_batch_of_one(rank, world_size):
    """A batch of one sharded over a data axis of one, reshaped and back: layouts, values and
    the input gradient."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.shardtensor import Shard, from_local

    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("data", "domain"))
    sizes = (3, 5)
    full = torch.randn(1, 8, 6, generator=torch.Generator().manual_seed(0))
    off = sum(sizes[:rank])
    local = full[:, off : off + sizes[rank]].clone().requires_grad_(True)
    x = from_local(local, mesh, [Shard(0), Shard(1)], {0: (1,), 1: sizes})
    y = x.reshape(1, 8, 2, 3)
    back = y.permute(0, 2, 1, 3).permute(0, 2, 1, 3).reshape(1, 8, 6)
    (back * 2).sum().backward()
    return {"placements": tuple(str(p) for p in y.placements), "sizes": y.spec.sizes,
            "y": (y.full_tensor(), full.reshape(1, 8, 2, 3)),
            "back": (back.full_tensor(), full), "grad": local.grad}
