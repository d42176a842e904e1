"""Point cloud <-> sharded grid (trilinear splat and gather) equals one process (F.grid_sample
and a dense splat), forward and gradients w.r.t. grid, values and coordinates."""

import pytest
import torch

from meshshard.testing import run_ranks
from tests.ops._grid_fns import run

# (grid rows per rank along spatial dim `axis`, points per rank, axis); the grid is 8 x 5 x 4
LAYOUTS = [((3, 5), (10, 30), 0), ((0, 8), (25, 15), 0), ((2, 0, 5, 1), (0, 20, 7, 13), 0),
           ((1, 1, 1, 5), (10, 10, 10, 10), 0), ((2, 3), (30, 10), 1),
           ((0, 1, 1, 2), (9, 0, 21, 10), 2)]


@pytest.mark.parametrize(("grid_sizes", "point_sizes", "axis"), LAYOUTS,
                         ids=lambda s: "x".join(map(str, s)) if isinstance(s, tuple) else f"ax{s}")
def test_point_grid_matches_single_process(grid_sizes, point_sizes, axis):
    for report in run_ranks(run, len(grid_sizes), grid_sizes, point_sizes, axis, timeout=300):
        assert tuple(report.pop("scatter_layout")) == grid_sizes
        for key, (got, want) in report.items():
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10,
                                       msg=lambda m, k=key: f"{k}: {m}")
