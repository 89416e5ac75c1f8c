"""The label-only access layer: mechanism, memo and the Python wrapper (paper Algorithm 2)."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from lucid.access import LabelOnlyClassifier, Memo, RandomSource, exponential_mechanism, true_label_probability
from lucid.access.synthetic import write_bounds, write_synthetic_run
from lucid.errors import LucidError
from lucid.network import confidence, load_networks

OFFSET = np.array([10.0, -5.0])
SCALE = np.array([0.5, 2.0])  # x_net = (x - offset) * scale; domain [0, 1]^2 in network space
LABELS = ["low", "mid", "high"]


def to_orig(xn: np.ndarray) -> np.ndarray:
    return xn / SCALE + OFFSET


@pytest.fixture()
def run_dir(tmp_path):
    return write_synthetic_run(
        tmp_path / "run", labels=LABELS, offset=OFFSET, scale=SCALE, bounds={0: 0.3, 1: None, 2: -1.0}
    )


def reference_n(run_dir, xn):
    """N's class and confidence from the shared IR (an independent forward implementation)."""
    scores = load_networks(run_dir).forward(xn)[0]
    return scores.argmax(1), confidence(scores)


# -- the exponential mechanism ----------------------------------------------------------------
@pytest.mark.parametrize("eps,num_classes", [(0.0, 3), (2.0, 3), (1.0, 2), (6.0, 4)])
def test_exponential_mechanism_matches_its_distribution(eps, num_classes):
    rng = RandomSource(seed=1)
    n = 40_000
    classes = np.arange(n) % num_classes
    drawn = exponential_mechanism(classes, num_classes, eps, rng)
    p_true = np.exp(eps / 2) / (np.exp(eps / 2) + num_classes - 1)
    assert true_label_probability(eps, num_classes) == pytest.approx(p_true)
    assert np.mean(drawn == classes) == pytest.approx(p_true, abs=0.015)
    # Every wrong class is equally likely: (1 - p) / (C - 1) each.
    offsets = (drawn - classes) % num_classes
    for k in range(1, num_classes):
        assert np.mean(offsets == k) == pytest.approx((1 - p_true) / (num_classes - 1), abs=0.015)
    assert drawn.min() >= 0 and drawn.max() < num_classes


def test_huge_epsilon_does_not_overflow_and_releases_the_label():
    drawn = exponential_mechanism(np.array([2, 0, 1]), 3, 1e6, RandomSource(seed=0))
    assert drawn.tolist() == [2, 0, 1]


def test_unseeded_randomness_comes_from_the_os():
    a, b = RandomSource().uniform(1000), RandomSource().uniform(1000)
    assert ((a >= 0) & (a < 1)).all() and not np.array_equal(a, b)
    assert 0.45 < a.mean() < 0.55


# -- the wrapper --------------------------------------------------------------------------
def test_released_labels_are_ns_labels_and_noise_follows_the_bounds(run_dir):
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, seed=0)
    xn = np.random.default_rng(5).random((400, 2))
    cls, conf = reference_n(run_dir, xn)
    upper = np.array([0.3, np.inf, -1.0])
    expected_noised = ~(conf > upper[cls])
    got_cls, noised = clf.decide(clf.to_network_space(to_orig(xn)))
    assert np.array_equal(got_cls, cls)
    assert np.array_equal(noised, expected_noised)
    assert 0 < noised.sum() < len(xn)  # the fixture exercises both branches
    labels = clf.predict(to_orig(xn))
    assert labels.tolist()[:3] == [LABELS[c] for c in clf.predict_index(to_orig(xn[:3]))]
    released = ~expected_noised
    assert (labels[released] == np.asarray(LABELS)[cls[released]]).all()
    # Class 1 has no bound (null): every input N labels 1 is noised; class 2 (bound -1) never.
    assert noised[cls == 1].all() and not noised[cls == 2].any()


def test_confidence_equal_to_the_bound_is_noised(run_dir):
    xn = np.array([[0.5, 0.5]])
    cls, conf = reference_n(run_dir, xn)
    write_bounds(run_dir, {int(cls[0]): float(conf[0])})
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, seed=0)
    assert clf.decide(xn)[1].tolist() == [True]
    write_bounds(run_dir, {int(cls[0]): float(np.nextafter(conf[0], -np.inf))})
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, seed=0)
    assert clf.decide(xn)[1].tolist() == [False]


def test_noised_answers_are_memoised_and_survive_a_restart(run_dir, tmp_path):
    write_bounds(run_dir, {0: None, 1: None, 2: None})  # everything noised
    memo_file = tmp_path / "memo.sqlite"
    x = to_orig(np.random.default_rng(2).random((300, 2)))
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=0.0, memo=memo_file, seed=1)
    first = clf.predict(x)
    # eps = 0: uniform draws, so the memo (not N) is what makes repeats agree.
    assert len(set(first.tolist())) == 3
    assert np.array_equal(clf.predict(x[::-1]), first[::-1])
    assert len(clf.memo) == 300
    clf.close()
    again = LabelOnlyClassifier.from_run(run_dir, epsilon=0.0, memo=memo_file, seed=99)
    assert np.array_equal(again.predict(x), first)
    fresh = LabelOnlyClassifier.from_run(run_dir, epsilon=0.0, seed=99)  # in-memory memo: new draws
    assert not np.array_equal(fresh.predict(x), first)


def test_duplicate_inputs_in_one_batch_share_one_draw(run_dir):
    write_bounds(run_dir, {0: None, 1: None, 2: None})
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=0.0, seed=3)
    x = np.repeat(to_orig(np.random.default_rng(0).random((20, 2))), 30, axis=0)
    labels = clf.predict(x).reshape(20, 30)
    assert (labels == labels[:, :1]).all()
    assert len(clf.memo) == 20


def test_clip_keys_the_memo_on_the_clipped_point(run_dir):
    write_bounds(run_dir, {0: None, 1: None, 2: None})
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=0.0, clip=True, seed=4)
    # 200 distinct raw inputs that all clip to the corner (1, 1): one draw, not 200.
    xn = np.column_stack([1 + np.linspace(0.1, 5, 200), 1 + np.linspace(0.1, 3, 200)])
    labels = clf.predict(to_orig(xn))
    assert len(set(labels.tolist())) == 1
    assert labels[0] == clf.predict(to_orig(np.array([[1.0, 1.0]])))[0]
    assert len(clf.memo) == 1


def test_negative_zero_and_rounding_at_the_domain_edge(run_dir):
    write_bounds(run_dir, {0: None, 1: None, 2: None})
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=0.0, seed=5)
    # Original-unit edges that scale to 0 / 1 up to float rounding are accepted.
    edge = np.array([[10.0, -5.0], [12.0, -4.5], [10.0 + 1e-13, -4.5]])
    clf.predict(edge)
    a = clf.to_network_space(np.array([[10.0, -5.0]]))
    assert not np.signbit(a).any()


@pytest.mark.parametrize(
    "bad,message",
    [
        ([[10.5]], "2 features"),
        ([[10.5, -4.8, 1.0]], "2 features"),
        ([10.5, -4.8], "2-D"),
        ([[10.5, float("nan")]], "finite"),
        ([[float("inf"), -4.8]], "finite"),
        ([["10.5", "-4.8"]], "only numbers"),
        ([[10.5, None]], "only numbers"),
        ([[10.5, -4.8], [10.5]], "rectangular"),
        ([[9.0, -4.8]], "outside the verified domain"),
        ([[10.5, -4.0]], "outside the verified domain"),
        ([[1.7e308, -4.8]], "outside the verified domain"),
    ],
)
def test_bad_inputs_are_refused_with_a_clear_message(run_dir, bad, message):
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, seed=0)
    with pytest.raises(LucidError, match=message):
        clf.predict(bad)


def test_clip_still_refuses_values_that_overflow_when_scaled(run_dir):
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, clip=True)
    assert clf.predict([[1e300, -4.8]]).shape == (1,)  # clipped
    with pytest.raises(LucidError, match="outside the verified domain"):
        clf.predict([[-1.7e308, 1.7e308]])  # (x - offset) * scale overflows to inf


def test_empty_batch(run_dir):
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0)
    assert clf.predict(np.zeros((0, 2))).shape == (0,)


def test_bounds_file_problems(run_dir):
    (run_dir / "bounds.json").unlink()
    with pytest.raises(LucidError, match="lucid verify"):
        LabelOnlyClassifier.from_run(run_dir, epsilon=1.0)
    (run_dir / "bounds.json").write_text("{not json")
    with pytest.raises(LucidError, match="corrupt"):
        LabelOnlyClassifier.from_run(run_dir, epsilon=1.0)
    write_bounds(run_dir, {7: 0.1})
    with pytest.raises(LucidError, match="out of range"):
        LabelOnlyClassifier.from_run(run_dir, epsilon=1.0)
    doc = {"format": "lucid-bounds/1", "bounds": {"0": {"upper": "high"}}}
    (run_dir / "bounds.json").write_text(json.dumps(doc))
    with pytest.raises(LucidError, match="finite number or null"):
        LabelOnlyClassifier.from_run(run_dir, epsilon=1.0)
    # A class missing from bounds.json, or an anytime (incomplete) bound, still works.
    write_bounds(run_dir, {0: 0.2}, complete=False)
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0)
    assert clf.bounds[0] == 0.2 and np.isinf(clf.bounds[1:]).all()


@pytest.mark.parametrize("eps", [-1, float("nan"), float("inf"), "abc"])
def test_bad_epsilon(run_dir, eps):
    with pytest.raises(LucidError, match="epsilon"):
        LabelOnlyClassifier.from_run(run_dir, epsilon=eps)


def test_cnn_runs_are_lowered_and_match_the_ir(tmp_path):
    from safetensors.numpy import save_file

    run = write_synthetic_run(tmp_path / "cnn", input_dim=5, bounds={0: 0.1, 1: None, 2: 0.0})
    rng = np.random.default_rng(0)
    k = 6
    tensors = {
        "conv.0.weight": rng.normal(size=(k, 2, 1, 3)).astype(np.float32),
        "conv.0.bias": rng.normal(size=(k, 2)).astype(np.float32),
        "layers.0.weight": rng.normal(size=(k, 4, 6)).astype(np.float32),
        "layers.0.bias": rng.normal(size=(k, 4)).astype(np.float32),
        "layers.1.weight": rng.normal(size=(k, 3, 4)).astype(np.float32),
        "layers.1.bias": rng.normal(size=(k, 3)).astype(np.float32),
        "removed": np.arange(-1, 5, dtype=np.int64),
    }
    save_file(tensors, str(run / "networks.safetensors"))
    meta = json.loads((run / "run.json").read_text())
    meta["architecture"] = {"type": "cnn", "conv_channels": [2], "kernel_size": 3, "hidden": [4]}
    (run / "run.json").write_text(json.dumps(meta))
    clf = LabelOnlyClassifier.from_run(run, epsilon=1.0, seed=0)
    xn = rng.random((50, 5))
    assert np.allclose(clf.scores(xn), load_networks(run).forward(xn)[0])


# -- the memo -----------------------------------------------------------------------------
def test_memo_evicts_the_least_recently_used(tmp_path):
    memo = Memo(tmp_path / "m.sqlite", max_size=3)
    memo.get_or_put([b"a", b"b", b"c"], np.array([0, 1, 2]))
    assert memo.get_or_put([b"a"], np.array([9])).tolist() == [0]  # a is now the newest
    memo.get_or_put([b"d"], np.array([1]))  # evicts b, the least recently used
    assert len(memo) == 3
    assert memo.lookup(b"b") is None and memo.lookup(b"a") == 0 and memo.lookup(b"d") == 1
    memo.close()
    # A smaller size on reopening trims the file at once.
    small = Memo(tmp_path / "m.sqlite", max_size=1)
    assert len(small) == 1 and small.lookup(b"d") == 1


def test_memo_refuses_another_models_file_and_garbage(tmp_path):
    Memo(tmp_path / "m.sqlite", fingerprint="model-a").close()
    with pytest.raises(LucidError, match="different model"):
        Memo(tmp_path / "m.sqlite", fingerprint="model-b")
    (tmp_path / "junk.sqlite").write_bytes(b"this is not a database" * 100)
    with pytest.raises(LucidError, match="memo"):
        Memo(tmp_path / "junk.sqlite")
    with pytest.raises(LucidError, match="not a directory"):
        Memo(tmp_path / "missing" / "m.sqlite")
    with pytest.raises(LucidError, match="at least 1"):
        Memo(None, max_size=0)


def test_memo_is_consistent_under_concurrent_writers(tmp_path):
    """Threads on one connection and a second connection race on the same keys: one draw wins."""
    path = tmp_path / "m.sqlite"
    memos = [Memo(path), Memo(path)]
    keys = [f"k{i}".encode() for i in range(50)]
    answers: list[dict[bytes, int]] = []
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            seen: dict[bytes, int] = {}
            for _ in range(5):
                got = memos[t % 2].get_or_put(keys, np.full(len(keys), t))
                for k, v in zip(keys, got.tolist()):
                    assert seen.setdefault(k, v) == v
            answers.append(seen)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert all(a == answers[0] for a in answers)
    assert len(memos[0]) == 50


def test_no_noise_is_drawn_for_memo_hits():
    memo = Memo(None)
    calls = []

    def propose(missing):
        calls.append(missing.tolist())
        return np.full(len(missing), 2)

    assert memo.get_or_put([b"a", b"b"], propose).tolist() == [2, 2]
    assert memo.get_or_put([b"a", b"c", b"a"], propose).tolist() == [2, 2, 2]
    assert memo.get_or_put([b"c", b"b"], propose).tolist() == [2, 2]  # all hits: no call
    assert calls == [[0, 1], [1]]
