"""The VNN-LIB property of a singleton iDP query, for a VNN-COMP verifier.

It pairs with the joint ONNX network of `onnx_write.joint_model` (outputs Y_0..Y_{C-2} = s_N[c] - s_N[u]
for u != c, then Y_{C-1}..Y_{2C-3} = s_i[c] - s_i[t] for t != c) and states the *violation*:

    x in the domain box  and  every Y of N >= beta  and  some Y of N_-i <= 0,

i.e. an input N labels c with confidence (top score minus runner-up) at least beta while N_-i does
not label it c: a leak. UNSAT proves that every input N labels c with confidence >= beta gets the
same label from N_-i, so it holds whenever beta exceeds the singleton bound beta*_{c,{N_-i}}.
Every constraint compares one variable with a constant: the form the VNN-COMP parsers read.
"""

from __future__ import annotations

import numpy as np


def number(v: float) -> str:
    """A decimal literal that parses back to the same float64 (no exponent: SMT-LIB has none)."""
    return np.format_float_positional(float(v), unique=True, trim="0")


def query_text(lower: np.ndarray, upper: np.ndarray, num_classes: int, cls: int, beta: float, header: list[str]) -> str:
    d = len(lower)
    margins = num_classes - 1
    lines = [f"; {line}" for line in header]
    lines += [f"(declare-const X_{j} Real)" for j in range(d)]
    lines += [f"(declare-const Y_{j} Real)" for j in range(2 * margins)]
    lines.append("; the input box: the run's domain, in the networks' input space (after the run's scaler)")
    for j in range(d):
        lines.append(f"(assert (>= X_{j} {number(lower[j])}))")
        lines.append(f"(assert (<= X_{j} {number(upper[j])}))")
    lines.append(f"; N labels class {cls} with confidence >= beta: s_N[{cls}] - s_N[u] >= beta for every u != {cls}")
    lines += [f"(assert (>= Y_{j} {number(beta)}))" for j in range(margins)]
    lines.append(f"; N_-i does not label it {cls}: s_i[{cls}] - s_i[t] <= 0 for some t != {cls}")
    cases = " ".join(f"(and (<= Y_{margins + j} 0.0))" for j in range(margins))
    lines.append(f"(assert (or {cases}))")
    return "\n".join(lines) + "\n"
