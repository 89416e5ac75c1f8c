"""Exact beta*_c for 2-input ReLU networks in rational arithmetic (tests only).

Every parameter and domain bound is a float, so `Fraction(float)` is its exact value. Inside one
joint activation pattern of N and one other network both are affine in x, so the input plane is
cut into convex polygons (half-plane clipping with Fraction vertices, no rounding anywhere); on
each polygon the leak condition (the other network's score of some t != c at least its score
of c) is one more half-plane and N's confidence, split by its runner-up, is linear, so its
maximum over the polygon is at a vertex. beta*_{c,{j}} is the largest such vertex value and
beta*_c the largest over the leave-one-out networks. Shares no code with lucid and uses no float
arithmetic, so it stays exact at any weight scale (1e-6 to 1e6 per layer and beyond), where
float64 oracles lose the differences between N and its neighbours.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

Poly = list[tuple[Fraction, Fraction]]


def _exact(a) -> list:
    """Nested lists of Fractions (exact values of the float64 entries)."""
    arr = np.asarray(a, dtype=np.float64)
    if arr.ndim == 0:
        return Fraction(float(arr))
    return [_exact(v) for v in arr]


def _clip(poly: Poly, a: tuple[Fraction, Fraction], b: Fraction) -> Poly:
    """The part of a convex polygon where a.x + b >= 0 (exact)."""
    if not poly:
        return poly
    vals = [a[0] * x + a[1] * y + b for x, y in poly]
    out: Poly = []
    n = len(poly)
    for i in range(n):
        j = (i + 1) % n
        if vals[i] >= 0:
            out.append(poly[i])
        if (vals[i] >= 0) != (vals[j] >= 0):
            t = vals[i] / (vals[i] - vals[j])
            (x0, y0), (x1, y1) = poly[i], poly[j]
            out.append((x0 + t * (x1 - x0), y0 + t * (y1 - y0)))
    dedup: Poly = []
    for p in out:
        if not dedup or dedup[-1] != p:
            dedup.append(p)
    if len(dedup) > 1 and dedup[0] == dedup[-1]:
        dedup.pop()
    return dedup


class _Affine:
    """Rows of an affine map x -> A x + a of the 2-D input (exact)."""

    def __init__(self, rows: list[tuple[Fraction, Fraction, Fraction]]):
        self.rows = rows

    @staticmethod
    def identity() -> "_Affine":
        one, zero = Fraction(1), Fraction(0)
        return _Affine([(one, zero, zero), (zero, one, zero)])

    def layer(self, w: list, b: list, mask: list[bool] | None) -> "_Affine":
        rows = []
        for i, (wi, bi) in enumerate(zip(w, b)):
            if mask is not None and not mask[i]:
                rows.append((Fraction(0), Fraction(0), Fraction(0)))
                continue
            ax = sum((wij * r[0] for wij, r in zip(wi, self.rows)), Fraction(0))
            ay = sum((wij * r[1] for wij, r in zip(wi, self.rows)), Fraction(0))
            c = sum((wij * r[2] for wij, r in zip(wi, self.rows)), Fraction(0)) + bi
            rows.append((ax, ay, c))
        return _Affine(rows)


def _pieces(nets: list[tuple[list, list]], lower, upper):
    """Polygons of the domain on which every network of `nets` is affine, with their score maps."""
    lo = [Fraction(float(v)) for v in lower]
    hi = [Fraction(float(v)) for v in upper]
    box: Poly = [(lo[0], lo[1]), (hi[0], lo[1]), (hi[0], hi[1]), (lo[0], hi[1])]
    depth = len(nets[0][0])
    regions = [(box, [_Affine.identity() for _ in nets])]
    for k in range(depth - 1):
        nxt = []
        for poly, maps in regions:
            pre = [m.layer(w[k], b[k], None) for m, (w, b) in zip(maps, nets)]
            parts = [(poly, [[] for _ in nets])]
            for n_idx, p in enumerate(pre):
                for ax, ay, c in p.rows:
                    split = []
                    for q, signs in parts:
                        on, off = _clip(q, (ax, ay), c), _clip(q, (-ax, -ay), -c)
                        if len(on) >= 3:
                            split.append((on, [s + [True] if i == n_idx else s for i, s in enumerate(signs)]))
                        if len(off) >= 3:
                            split.append((off, [s + [False] if i == n_idx else s for i, s in enumerate(signs)]))
                    parts = split
            for q, signs in parts:
                post = [m.layer(w[k], b[k], s) for m, (w, b), s in zip(maps, nets, signs)]
                nxt.append((q, post))
        regions = nxt
    out = []
    for poly, maps in regions:
        out.append((poly, [m.layer(w[-1], b[-1], None) for m, (w, b) in zip(maps, nets)]))
    return out


def _value(row, p) -> Fraction:
    return row[0] * p[0] + row[1] * p[1] + row[2]


def _diff(r, s):
    return (r[0] - s[0], r[1] - s[1], r[2] - s[2])


def exact_singleton(net_n, net_p, cls: int, lower, upper) -> tuple[Fraction | None, tuple | None]:
    """(beta*_{c,{p}}, an input reaching it) exactly; (None, None) when no input leaks (-inf).

    net_n, net_p: (weights [out, in] list, biases list) as float arrays."""
    nets = [([_exact(w) for w in ws], [_exact(b) for b in bs]) for ws, bs in (net_n, net_p)]
    best, arg = None, None
    for poly, (sn, sp) in _pieces(nets, lower, upper):
        classes = len(sn.rows)
        for t in range(classes):
            if t == cls:
                continue
            leak = _diff(sp.rows[t], sp.rows[cls])  # s'_t - s'_c >= 0: the other network does not pick c
            q = _clip(poly, leak[:2], leak[2])
            if not q:
                continue
            for u in range(classes):  # the piece where N's runner-up is u
                if u == cls:
                    continue
                r = q
                for v in range(classes):
                    if v not in (cls, u):
                        d = _diff(sn.rows[u], sn.rows[v])
                        r = _clip(r, d[:2], d[2])
                if not r:
                    continue
                objective = _diff(sn.rows[cls], sn.rows[u])
                for vertex in r:
                    val = _value(objective, vertex)
                    if best is None or val > best:
                        best, arg = val, vertex
    return best, arg


def exact_bound(stack, cls: int, lower, upper) -> Fraction | None:
    """beta*_c over every leave-one-out network of a NetworkStack (position 0 is N); None = -inf."""
    net_n = ([w[0] for w in stack.weights], [b[0] for b in stack.biases])
    best = None
    for j in range(1, len(stack)):
        net_p = ([w[j] for w in stack.weights], [b[j] for b in stack.biases])
        value, _ = exact_singleton(net_n, net_p, cls, lower, upper)
        if value is not None and (best is None or value > best):
            best = value
    return best


def exact_scores(stack, j: int, x) -> list[Fraction]:
    """The scores of network j of a NetworkStack at x, in exact arithmetic."""
    h = [Fraction(float(v)) for v in x]
    layers = len(stack.weights)
    for k in range(layers):
        w, b = _exact(stack.weights[k][j]), _exact(stack.biases[k][j])
        h = [sum((wi * hi for wi, hi in zip(row, h)), Fraction(0)) + bi for row, bi in zip(w, b)]
        if k < layers - 1:
            h = [max(v, Fraction(0)) for v in h]
    return h


def exact_label_and_agreement(stack, x) -> tuple[int, bool]:
    """N's exact label at x (ties: the lowest index, as numpy's argmax) and whether every network
    of the stack picks the same label strictly (exact arithmetic)."""
    labels = []
    for j in range(len(stack)):
        h = exact_scores(stack, j, x)
        top = max(range(len(h)), key=lambda i: (h[i], -i))
        strict = all(h[top] > h[i] for i in range(len(h)) if i != top)
        labels.append((top, strict))
    n_label = labels[0][0]
    return n_label, all(label == n_label and strict for label, strict in labels[1:])
