"""Mt-KaHyPar parameter sets that are not one of its built-in presets (``Initializer.
context_from_file``), for :mod:`meshshard.partition.hypergraph`.

``deterministic_quality_fast``: the algorithms of Mt-KaHyPar's ``deterministic_quality`` preset
(deterministic coarsening, Jet refinement, deterministic flow-based refinement), so the result
is the same for the same input and seed, with cheaper settings: flow regions of 4x (not 16x) the
cut size and 1 (not 2) BFS layer, 5 (not 20) initial-partitioning runs, a contraction limit of
80 k (not 160 k) vertices, 6 (not 8) Jet rounds without improvement. Measured on 200k points
(kNN-8) and 196k tets (dual graph), P = 4, 16, 64, one thread: ghost rows within -1.9 % to
+0.3 % of ``deterministic_quality``'s for 0.27-0.59x its CPU (docs/hypergraph-partitioning.md).

Mt-KaHyPar reads a configuration file whole (a key it does not know is an error, a key left
out takes its command line's default, not the preset's), so every key is written; the names
are those of mtkahypar 1.7.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

__all__ = ["CONFIGS", "context_from_config"]

_DETERMINISTIC_QUALITY_FAST = {
    "mode": "direct",
    "preset-type": "deterministic_quality",
    "deterministic": "true",
    "maxnet-removal-factor": "0.01",
    "smallest-maxnet-threshold": "50000",
    "maxnet-ignore": "1000",
    "num-vcycles": "0",
    "s-use-localized-random-shuffle": "false",
    "s-static-balancing-work-packages": "128",
    "p-enable-community-detection": "true",
    "p-louvain-edge-weight-function": "hybrid",
    "p-max-louvain-pass-iterations": "5",
    "p-louvain-min-vertex-move-fraction": "0.01",
    "p-vertex-degree-sampling-threshold": "200000",
    "p-louvain-low-memory-contraction": "true",
    "p-num-sub-rounds": "16",
    "c-type": "deterministic_multilevel_coarsener",
    "c-use-adaptive-edge-size": "false",
    "c-resolve-swaps": "true",
    "c-min-shrink-factor": "1.01",
    "c-max-shrink-factor": "2.5",
    "c-s": "1",
    "c-t": "80",
    "c-vertex-degree-sampling-threshold": "200000",
    "c-num-sub-rounds": "3",
    "c-rating-score": "heavy_edge",
    "c-rating-heavy-node-penalty": "no_penalty",
    "c-rating-acceptance-criterion": "best_prefer_unmatched",
    "i-mode": "rb",
    "i-runs": "5",
    "i-use-adaptive-ip-runs": "false",
    "i-perform-refinement-on-best-partitions": "false",
    "i-remove-degree-zero-hns-before-ip": "true",
    "i-fm-refinement-rounds": "3",
    "i-lp-maximum-iterations": "20",
    "i-lp-initial-block-size": "5",
    "i-r-refine-until-no-improvement": "false",
    "i-r-lp-type": "deterministic",
    "i-r-lp-maximum-iterations": "5",
    "i-r-sync-lp-sub-rounds": "1",
    "i-r-lp-he-size-activation-threshold": "100",
    "i-r-sync-lp-active-nodeset": "true",
    "i-r-fm-type": "do_nothing",
    "i-population-size": "64",
    "r-refine-until-no-improvement": "false",
    "r-rebalancer-type": "deterministic",
    "r-max-det-rebalancing-rounds": "0",
    "r-det-rebalancing-deadzone": "0.1",
    "r-det-rebalancing-heavy-vertex-exclusion": "1.5",
    "r-lp-type": "do_nothing",
    "r-lp-maximum-iterations": "5",
    "r-sync-lp-sub-rounds": "1",
    "r-lp-he-size-activation-threshold": "100",
    "r-sync-lp-active-nodeset": "true",
    "r-jet-type": "deterministic",
    "r-jet-num-iterations": "6",
    "r-jet-relative-improvement-threshold": "0.001",
    "r-jet-dynamic-rounds": "3",
    "r-jet-initial-negative-gain": "0.75",
    "r-jet-final-negative-gain": "0.0",
    "r-fm-type": "do_nothing",
    "r-flow-algo": "deterministic",
    "r-flow-scaling": "4",
    "r-flow-max-num-pins": "4294967295",
    "r-flow-find-most-balanced-cut": "true",
    "r-flow-determine-distance-from-cut": "true",
    "r-flow-max-bfs-distance": "1",
    "r-flow-min-relative-improvement-per-round": "0.001",
    "r-flow-time-limit-factor": "8",
    "r-flow-skip-small-cuts": "true",
    "r-flow-skip-unpromising-blocks": "true",
    "r-flow-pierce-in-bulk": "true",
    "r-flow-process-mapping-policy": "lower_bound",
}

CONFIGS = {"deterministic_quality_fast": _DETERMINISTIC_QUALITY_FAST}
"""Parameter sets by meshshard preset name (all reproducible: deterministic algorithms only)."""


def context_from_config(initializer: Any, name: str) -> Any:
    """A Mt-KaHyPar context for the parameter set ``name`` of :data:`CONFIGS`.

    Raises
    ------
    RuntimeError
        The installed mtkahypar does not take these parameters (another version).
    """
    text = "".join(f"{k}={v}\n" for k, v in CONFIGS[name].items())
    fd, path = tempfile.mkstemp(prefix="meshshard-mtk-", suffix=".ini")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        try:
            return initializer.context_from_file(path)
        except Exception as e:  # mtkahypar's InvalidParameterError and kin
            msg = (f"preset={name!r} is a parameter set for mtkahypar 1.7, which the installed "
                   f"mtkahypar refused ({e}); use preset='deterministic_quality' instead")
            raise RuntimeError(msg) from e
    finally:
        os.unlink(path)
