# applies the LUCID_JITTER experiment to a snapshot's lucid/bab/regions.py
import sys
p = sys.argv[1] + "/lucid/bab/regions.py"; s = open(p).read()
old = "    return np.clip((X - offset) * scale, lower, upper)\n"
new = """    X = np.clip((X - offset) * scale, lower, upper)
    spec = os.environ.get("LUCID_JITTER")
    if spec:
        m, sigma = int(spec.split(",")[0]), float(spec.split(",")[1])
        rng = np.random.default_rng(12345)
        extra = X[None] + sigma * (upper - lower) * rng.standard_normal((m,) + X.shape)
        X = np.vstack([X, np.clip(extra.reshape(-1, X.shape[1]), lower, upper)])
    return X
"""
assert old in s and "import os" in s; open(p, "w").write(s.replace(old, new))
