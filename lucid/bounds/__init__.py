"""Sound bounds on the neurons of a network over an input box.

- `interval`: interval arithmetic (outward-rounded), batched over many networks at once.
- `lp`: LP-based layer-by-layer tightening of N's pre-activation bounds (triangle relaxation of
  earlier layers), with every LP optimum replaced by a rigorous dual bound.
- `difference`: intervals on z# - z between a hyper-network and N (paper's propagation).
"""

from lucid.bounds.interval import LayerBounds, interval_bounds

__all__ = ["LayerBounds", "interval_bounds"]
