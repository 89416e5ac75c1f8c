"""Abstract Gradient Training: k-removal parameter boxes for algorithm T (see docs/agt.md)."""

from lucid.agt.train import DEFAULT_MAX_WIDTH, AgtBox, AgtDiverged, abstract_train, agt_boxes

__all__ = ["DEFAULT_MAX_WIDTH", "AgtBox", "AgtDiverged", "abstract_train", "agt_boxes"]
