"""Count, in a rendered PNG's 3-D views, the pixels of each shard's colour (any shading)."""

from __future__ import annotations

import matplotlib.image as mpimg
import numpy as np

from meshshard.partition.render import VIEW_BOXES, shown_shards


def shard_pixels(png, parts: int) -> np.ndarray:
    """Pixels per shard inside the 3-D view boxes: a pixel counts for shard ``p`` when it is
    its palette colour scaled by a lighting factor in [0.5, 1.05] (within 10 levels)."""
    img = np.round(mpimg.imread(png)[..., :3] * 255)
    views = np.concatenate([img[y0:y1, x0:x1].reshape(-1, 3) for x0, y0, x1, y1 in VIEW_BOXES])
    return shown_shards(views, parts)
