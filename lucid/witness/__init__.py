"""Leaking inputs: `lucid.witness.replay` turns a candidate into a true lower bound (or drops it);
`lucid.witness.search` proposes candidates without a solver."""
