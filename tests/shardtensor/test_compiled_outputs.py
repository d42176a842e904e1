"""A compiled model's output used by eager code: ``torch.compile(model)(x).sum().backward()``.

The compiled backward takes each output's gradient in the layout it traced; only the mesh and
placements reach torch's ``__coerce_same_metadata_as_tangent__``, not the per-rank sizes. An
eager ``sum`` gives the output a Replicate gradient, which failed ("we guessed its metadata
incorrectly"); each compiled output an eager op uses now passes an identity node that returns
the gradient in the output's layout (``_aten/compiled_outputs._KeepLayout``); a gradient the
user gives ``backward`` or ``autograd.grad`` for the output is redistributed to its layout
(``_aten/engine._in_root_layouts``). Gradients against one process, fp64, on uneven layouts
with empty shards.
"""

import pytest
import torch

from meshshard.testing import run_ranks
from tests.shardtensor import _compiled_out_fns

LAYOUTS = {2: (3, 5), 3: (1, 0, 7)}


@pytest.mark.parametrize("world", sorted(LAYOUTS))
def test_eager_losses_on_a_compiled_output_backpropagate_like_one_process(world):
    for rank, rep in enumerate(run_ranks(_compiled_out_fns.compiled_losses, world,
                                         LAYOUTS[world], timeout=300)):  # fmt: skip
        for name, pairs in rep.items():
            for k, (got, want) in enumerate(pairs):
                what = f"rank {rank} {name} #{k}"
                torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12,
                                           msg=lambda m, w=what: f"{w}: {m}")
