"""MILP encodings of the iDP decision-bound problem (paper Eq. 3)."""

from lucid.encodings.model import MilpModel

__all__ = ["MilpModel"]
