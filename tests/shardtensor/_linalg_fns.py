"""Cases for ``test_linalg.py``: products contracting or keeping the sharded dim (einsum,
matmul, mv, dot), against one process (run by :mod:`tests.shardtensor._rule_cases`, which
describes a case)."""

from __future__ import annotations

import torch

from tests.shardtensor._rule_cases import R, case


@case("linalg", "einsum_matmul", seed=1024,
      extras=[(R, (5, 4), True), (R, (5,), True), (R, (2, 4, "N"), True)], mesh2d=False)
def _c(x, w, v, u):
    return (torch.einsum("bnc,bnd->bcd", x, x), torch.einsum("bnc,cd->bnd", x, w),
            torch.einsum("bnc,bnc->bn", x, x.cos()), x @ v, u @ x, x.transpose(1, 2) @ x,
            torch.matmul(x[0], v), torch.mv(x[1], v), torch.dot(x[0, :, 0], x[1, :, 1]))
