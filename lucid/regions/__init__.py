"""Region-wise decision bounds: a partition of the verified domain into axis-aligned boxes, each
with its own per-class bound (bounds.json's `regions`, written by `lucid verify --regions K`).

The partition is a binary tree with two kinds of split, so every point of the domain, boundary
points included, reaches exactly one leaf:

- an *axis* split cuts the node's box at `threshold` on one `feature`: an input goes to the right
  child when x[feature] >= threshold and to the left child otherwise. Each child is verified over
  its *closed* box ([lower, threshold] or [threshold, upper] on that feature), which contains every
  point the walk sends to it (the left box also holds the boundary plane, which is harmless: a
  bound over a larger set is still a bound);
- a *carve* splits off a closed box inside the node's box: an input inside it (lower <= x <= upper
  on every feature) goes to the right child, verified over that box; every other input goes to the
  left child, whose cell is the node's box minus the carved one and which keeps the node's box
  (a superset of its cell) as the box it is verified over. One carve makes one leaf of a box
  around data, where axis splits would need two cuts per feature.

Why a released label stays safe, whatever chose the boxes: an input x is released only when N's
confidence at x is above the bound of x's leaf for N's class, and that bound is at least every
leaking confidence inside the leaf's box, which holds the leaf's cell (it is verified over that
box, and a node's bound is capped by its parent's, which holds over a superset). The choice of
boxes only decides which sound bound is compared with.

`locate` walks the tree a fixed number of steps (the tree's depth) for every input
(lucid/regions/lookup.py).

The package: the partition (`tree`), the reader of its bounds.json section (`reader`), its
access-time walk (`lookup`); for `lucid verify --regions K` (whose strategy is
lucid/verify/regions.py) one box's work (`one_box`) and the choices of where to refine (`choice`);
`lucid log`'s view of the boxes (`log_view`). Only `tree`, `reader` and `lookup` sit beside the
run directory, where the access layer reads them; the rest sit with the engine
(tests/project/test_layering.py).
"""

from lucid.regions.tree import CARVE, MAX_DEPTH, REGIONS_FORMAT, RegionTree

__all__ = ["CARVE", "MAX_DEPTH", "REGIONS_FORMAT", "RegionTree"]
