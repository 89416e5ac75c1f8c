"""Independent exact reference for beta*_{c,{N'}} on tiny networks (tests only).

Enumerates every joint activation pattern of N and N' that is realised by some input (depth-
first over neurons, with an LP feasibility check per branch, reusing a known point of the
parent region to skip the check for the branch that contains it). Inside one pattern both
networks are affine, so beta* restricted to it is one LP per target class t:
    max beta  s.t.  x in region, s_c - s_u >= beta (all u != c), s'_t >= s'_c.
For 2-D inputs the regions are instead computed exactly as convex polygons (half-plane
clipping): the optimum of a piecewise-linear objective over a polygon is at one of its
vertices, so beta* is a max over finitely many vertices, evaluated with the real networks.
Uses only numpy and HiGHS' LP solver (called directly: scipy's linprog costs three times as much per
tiny LP, and these are most of the tests' oracle time); shares no code with lucid's bounds or encoder.
"""

from __future__ import annotations

import highspy
import numpy as np

_HIGHS: highspy.Highs | None = None


def _lp_min(c, A, b, lower, upper):
    """(x, min c.x) s.t. A x <= b, lower <= x <= upper (None entries of the bounds: free), or None
    when HiGHS does not report an optimum."""
    global _HIGHS
    if _HIGHS is None:
        _HIGHS = highspy.Highs()
        _HIGHS.setOptionValue("output_flag", False)
    h, inf = _HIGHS, highspy.kHighsInf
    h.clearModel()
    A = np.asarray(A, float)
    m, n = A.shape
    lo = np.array([-inf if v is None else v for v in lower], float)
    hi = np.array([inf if v is None else v for v in upper], float)
    h.addVars(n, lo, hi)
    h.changeColsCost(n, np.arange(n, dtype=np.int32), np.asarray(c, float))
    h.addRows(m, np.full(m, -inf), np.asarray(b, float), m * n, np.arange(0, m * n, n, dtype=np.int32),
              np.tile(np.arange(n, dtype=np.int32), m), A.ravel())
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return np.array(h.getSolution().col_value), h.getInfo().objective_function_value


def _forward_maps(weights, biases, masks):
    """Affine maps (A, a) of the pre-activations of the layer after the given masks."""
    d = weights[0].shape[1]
    A, a = np.eye(d), np.zeros(d)
    for k, mask in enumerate(masks):
        A, a = weights[k] @ A, weights[k] @ a + biases[k]
        A, a = A * mask[:, None], a * mask
    k = len(masks)
    return weights[k] @ A, weights[k] @ a + biases[k]


def _feasible_point(G, h, lower, upper):
    d = len(lower)
    if len(G) == 0:
        return (lower + upper) / 2
    res = _lp_min(np.zeros(d), G, h, lower, upper)
    return None if res is None else res[0]


def exact_singleton_bound(net_n, net_p, cls: int, lower, upper) -> tuple[float, np.ndarray | None]:
    """(beta*, argmax x) for N = net_n, S = {net_p}; nets are (weights, biases) lists."""
    lower = np.asarray(lower, float)
    upper = np.asarray(upper, float)
    if len(lower) == 2:
        return exact_singleton_bound_2d(net_n, net_p, cls, lower, upper)
    (wn, bn), (wp, bp) = net_n, net_p
    L = len(wn)
    best = [-np.inf, None]

    def leaf(G, h, mn, mp):
        Sn, sn = _forward_maps(wn, bn, mn)
        Sp, sp = _forward_maps(wp, bp, mp)
        C = len(sn)
        d = len(lower)
        for t in range(C):
            if t == cls:
                continue
            rows = [np.hstack([g, 0.0]) for g in G]
            rhs = list(h)
            for u in range(C):
                if u != cls:
                    rows.append(np.hstack([-(Sn[cls] - Sn[u]), 1.0]))
                    rhs.append(sn[cls] - sn[u])
            rows.append(np.hstack([-(Sp[t] - Sp[cls]), 0.0]))
            rhs.append(sp[t] - sp[cls])
            c = np.zeros(d + 1)
            c[-1] = -1
            res = _lp_min(c, rows, rhs, list(lower) + [None], list(upper) + [None])
            if res is not None and -res[1] > best[0]:
                best[0], best[1] = -res[1], res[0][:d]

    def layer(k, G, h, point, mn, mp):
        if k == L - 1:
            leaf(G, h, mn, mp)
            return
        An, an = _forward_maps(wn, bn, mn)
        Ap, ap = _forward_maps(wp, bp, mp)
        P, p = np.vstack([An, Ap]), np.concatenate([an, ap])
        n = len(an)

        def neuron(j, G, h, point, signs):
            if j == len(p):
                signs = np.array(signs, float)
                layer(k + 1, G, h, point, mn + [signs[:n]], mp + [signs[n:]])
                return
            value = P[j] @ point + p[j]
            for on in ((value >= 0), not (value >= 0)):
                # on: P x + p >= 0  <=>  -P x <= p ; off: P x <= -p
                g, hh = (-P[j], p[j]) if on else (P[j], -p[j])
                G2, h2 = G + [g], h + [hh]
                pt = point if (on == (value >= 0)) else _feasible_point(G2, h2, lower, upper)
                if pt is not None:
                    neuron(j + 1, G2, h2, pt, signs + [1.0 if on else 0.0])

        neuron(0, G, h, (lower + upper) / 2 if point is None else point, [])

    layer(0, [], [], None, [], [])
    return best[0], best[1]


def grid_leak_max(stack, positions, cls: int, lower, upper, n: int = 201) -> float:
    """Max of N's confidence over a dense grid of 2-D inputs where some network of S disagrees."""
    g = np.stack(np.meshgrid(np.linspace(lower[0], upper[0], n), np.linspace(lower[1], upper[1], n)), -1).reshape(-1, 2)
    scores = stack.forward(g)  # [K, B, C]
    def conf(s):
        own = s[..., cls]
        other = np.delete(s, cls, axis=-1).max(-1)
        return own - other
    cn = conf(scores[0])
    leaks = (conf(scores[np.asarray(positions)]) <= 0).any(0)
    return float(cn[leaks].max()) if leaks.any() else -np.inf


def _clip(poly: np.ndarray, a: np.ndarray, b: float) -> np.ndarray:
    """The part of a convex polygon (vertices in order) where a.x + b >= 0."""
    if len(poly) == 0:
        return poly
    v = poly @ a + b
    out = []
    n = len(poly)
    for i in range(n):
        j = (i + 1) % n
        if v[i] >= 0:
            out.append(poly[i])
        if (v[i] >= 0) != (v[j] >= 0):
            t = v[i] / (v[i] - v[j])
            out.append(poly[i] + t * (poly[j] - poly[i]))
    return np.array(out).reshape(-1, 2)


def _scores(net, x):
    h = x
    for k, (w, b) in enumerate(zip(*net)):
        h = h @ w.T + b
        if k < len(net[0]) - 1:
            h = np.maximum(h, 0)
    return h


def exact_singleton_bound_2d(net_n, net_p, cls, lower, upper, tol: float = 1e-12):
    (wn, bn), (wp, bp) = net_n, net_p
    L = len(wn)
    box = np.array([[lower[0], lower[1]], [upper[0], lower[1]], [upper[0], upper[1]], [lower[0], upper[1]]])
    regions = [(box, [], [])]
    for k in range(L - 1):
        nxt = []
        for poly, mn, mp in regions:
            An, an = _forward_maps(wn, bn, mn)
            Ap, ap = _forward_maps(wp, bp, mp)
            P, p = np.vstack([An, Ap]), np.concatenate([an, ap])
            parts = [(poly, [])]
            for j in range(len(p)):
                split = []
                for q, signs in parts:
                    on, off = _clip(q, P[j], p[j]), _clip(q, -P[j], -p[j])
                    if len(on):
                        split.append((on, signs + [1.0]))
                    if len(off):
                        split.append((off, signs + [0.0]))
                parts = split
            n = len(an)
            nxt += [(q, mn + [np.array(sg[:n])], mp + [np.array(sg[n:])]) for q, sg in parts]
        regions = nxt
    best, arg = -np.inf, None
    C = wn[-1].shape[0]
    for poly, mn, mp in regions:
        Sn, sn = _forward_maps(wn, bn, mn)
        Sp, sp = _forward_maps(wp, bp, mp)
        for t in range(C):
            if t == cls:
                continue
            q = _clip(poly, Sp[t] - Sp[cls], sp[t] - sp[cls])
            for u in range(C):  # the piece where N's runner-up is u: objective is linear there
                if u == cls:
                    continue
                r = q
                for v in range(C):
                    if v not in (cls, u):
                        r = _clip(r, (Sn[v] - Sn[u]), sn[v] - sn[u])  # s_u >= s_v
                if not len(r):
                    continue
                sc_n = _scores(net_n, r)
                sc_p = _scores(net_p, r)
                conf_n = sc_n[:, cls] - np.delete(sc_n, cls, 1).max(1)
                conf_p = sc_p[:, cls] - np.delete(sc_p, cls, 1).max(1)
                ok = conf_p <= tol * (1 + np.abs(sc_p).max(1))
                if ok.any() and conf_n[ok].max() > best:
                    i = np.flatnonzero(ok)[np.argmax(conf_n[ok])]
                    best, arg = float(conf_n[i]), r[i]
    return best, arg


def tiny_stack(seed: int, hidden=(4, 4), classes: int = 2, k: int = 5, noise: float = 0.15, d: int = 2):
    """N (position 0) and k-1 perturbed copies standing in for leave-one-out networks.

    Parameters are float32-representable, like trained networks.
    """
    from lucid.network import NetworkStack

    rng = np.random.default_rng(seed)
    sizes = [d, *hidden, classes]
    weights, biases = [], []
    for i in range(len(sizes) - 1):
        w0 = rng.normal(size=(sizes[i + 1], sizes[i]))
        b0 = rng.normal(size=sizes[i + 1]) * 0.3
        w = np.stack([w0] + [w0 + noise * rng.normal(size=w0.shape) for _ in range(k - 1)])
        b = np.stack([b0] + [b0 + noise * rng.normal(size=b0.shape) for _ in range(k - 1)])
        weights.append(w.astype(np.float32).astype(np.float64))
        biases.append(b.astype(np.float32).astype(np.float64))
    return NetworkStack(weights, biases, np.arange(-1, k - 1))


def network(stack, position: int):
    return [w[position] for w in stack.weights], [b[position] for b in stack.biases]


def exact_for(stack, position: int, cls: int, lower, upper) -> float:
    return exact_singleton_bound(network(stack, 0), network(stack, position), cls, lower, upper)[0]
