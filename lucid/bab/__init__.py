"""The branch-and-bound engine over network sets (paper Algorithm 1, LUCID-Compute): the engine,
its class state, nodes, anytime bounds, screening, schedule and workers, and the one place that
assembles it (`assembly`). A verification run that drives it: `lucid.verify`.
"""
