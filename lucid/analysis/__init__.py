"""Node analysis: the verification problem of a run, the Eq. 3 MILP of a node (a set of leave-one-out
networks), its solve with every soundness check, and the screen that bounds every single network
without a solver."""
