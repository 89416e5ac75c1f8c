"""`lucid serve`: a real server process on a free loopback port, spoken to over HTTP."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest

from lucid.network import confidence, load_networks
from serve_helpers import LABELS, server, to_orig
from synthetic_runs import write_bounds

# `connection: close` ends a connection whose request was answered before its body was read (a 413
# on its Content-Length, lucid/access/protocol.py): it depends on the request and the network's
# timing, never on N.
ALLOWED_HEADERS = {"content-type", "content-length", "date", "www-authenticate", "connection"}


def test_labels_only_auth_and_every_bad_request(run_dir, tmp_path):
    """One server (starting one costs seconds): answers, bearer auth, and every bad input."""
    xn = np.random.default_rng(0).random((200, 2))
    scores = load_networks(run_dir).forward(xn)[0]
    cls, conf = scores.argmax(1), confidence(scores)
    released = conf > np.array([0.3, np.inf, -1.0])[cls]
    assert 0 < released.sum() < len(xn)
    bad_bodies = [
        (b"not json", 400),
        (b'{"inputs": [[10.5, NaN]]}', 422),
        (b'{"inputs": [[10.5, Infinity]]}', 422),
        (b'{"inputs": [[10.5, 1e999]]}', 422),
        (b"[1, 2]", 422),
        (b'{"rows": [[10.5, -4.8]]}', 422),
        (b'{"inputs": [[10.5, -4.8]], "debug": true}', 422),
        (b'{"inputs": "10.5,-4.8"}', 422),
        (b'{"inputs": [10.5, -4.8]}', 422),
        (b'{"inputs": [[10.5]]}', 422),
        (b'{"inputs": [[10.5, -4.8, 3]]}', 422),
        (b'{"inputs": [[10.5, -4.8], [10.5]]}', 422),
        (b'{"inputs": [["10.5", "-4.8"]]}', 422),
        (b'{"inputs": [[true, -4.8]]}', 422),
        (b'{"inputs": [[null, -4.8]]}', 422),
        (b'{"inputs": [[[10.5], -4.8]]}', 422),
        (b'{"inputs": [[9.0, -4.8]]}', 422),  # outside the verified domain
        (b'{"inputs": [[10.5, 100]]}', 422),
        (b'{"inputs": [[10.5, -4.8]' + b", [10.5, -4.8]" * 300 + b"]}", 413),  # > --max-batch 300
        (b'{"inputs": [[' + b"1" * 25000 + b"]]}", 413),  # > --max-body 20000
        (b"[" * 1500 + b"]" * 1500, 400),  # deep nesting
    ]
    args = ["--epsilon", "1", "--memo", str(tmp_path / "m.sqlite"), "--max-batch", "300", "--max-body", "20000",
            "--api-key-env", "LUCID_TEST_KEY"]
    auth = {"authorization": "Bearer s3cret"}
    with server(run_dir, *args, env={"LUCID_TEST_KEY": "s3cret"}) as url:
        assert httpx.get(url + "/healthz").json() == {"status": "ok"}  # health needs no token
        r = httpx.post(url + "/v1/predict", json={"inputs": to_orig(xn)}, headers=auth)
        assert r.status_code == 200
        assert set(r.json()) == {"labels"}
        assert set(r.headers) <= ALLOWED_HEADERS
        labels = np.asarray(r.json()["labels"])
        assert (labels[released] == np.asarray(LABELS)[cls[released]]).all()
        assert set(labels.tolist()) <= set(LABELS)
        assert httpx.post(url + "/v1/predict", json={"inputs": []}, headers=auth).json() == {"labels": []}

        body = {"inputs": to_orig([[0.5, 0.5]])}
        assert httpx.post(url + "/v1/predict", json=body).status_code == 401
        wrong = httpx.post(url + "/v1/predict", json=body, headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401 and set(wrong.json()) == {"error"}

        for body, status in bad_bodies:
            headers = {"content-type": "application/json", **auth}
            r = httpx.post(url + "/v1/predict", content=body, headers=headers)
            assert r.status_code == status, body[:60]
            assert set(r.json()) == {"error"} and r.json()["error"], body[:60]
            text = r.text.lower()
            assert "confidence" not in text and "bound" not in text and "score" not in text
            assert set(r.headers) <= ALLOWED_HEADERS
        assert httpx.get(url + "/v1/predict", headers=auth).status_code == 405
        assert httpx.get(url + "/nope").json() == {"error": "not found"}
        # The server still answers normally afterwards, identically for repeated inputs.
        again = httpx.post(url + "/v1/predict", json={"inputs": to_orig(xn)}, headers=auth).json()["labels"]
        assert again == labels.tolist()


def test_restart_with_the_same_memo_gives_identical_answers(run_dir, tmp_path):
    write_bounds(run_dir, {0: None, 1: None, 2: None})  # all noised; eps 0 = uniform draws
    memo = tmp_path / "m.sqlite"
    inputs = to_orig(np.random.default_rng(1).random((100, 2)))
    with server(run_dir, "--epsilon", "0", "--memo", str(memo)) as url:
        first = httpx.post(url + "/v1/predict", json={"inputs": inputs}).json()["labels"]
    assert len(set(first)) == 3
    # Restarted with --clip: in-domain inputs keep their stored answers, outside ones are clipped.
    outside = [[9.0, -4.8], [100.0, 100.0]]
    with server(run_dir, "--epsilon", "0", "--memo", str(memo), "--clip") as url:
        second = httpx.post(url + "/v1/predict", json={"inputs": inputs[::-1] + outside}).json()["labels"]
    assert second[:100][::-1] == first and len(second) == 102


def test_concurrent_clients(run_dir, tmp_path):
    """8 clients (each its own API key) x 500 requests on a shared pool of inputs: no errors,
    one answer per input, and a ledger with no lost or double-counted entry."""
    write_bounds(run_dir, {0: 0.3, 1: None, 2: None})
    memo = tmp_path / "m.sqlite"
    keys = tmp_path / "keys.txt"
    keys.write_text("# name token\n" + "".join(f"c{t} token-{t}\n" for t in range(8)))
    pool = to_orig(np.random.default_rng(2).random((300, 2)))
    answers: list[dict[int, str]] = [dict() for _ in range(8)]
    errors: list[str] = []

    def client(t: int, url: str) -> None:
        # http.client on a keep-alive connection: far less client CPU than httpx, so the
        # 4000 requests stay fast on a 2-core CI machine.
        rng = np.random.default_rng(100 + t)
        conn = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=30)
        try:
            for _ in range(500):
                picks = rng.integers(0, len(pool), size=int(rng.integers(1, 4)))
                conn.request("POST", "/v1/predict", json.dumps({"inputs": [pool[i] for i in picks]}),
                             {"content-type": "application/json", "authorization": f"Bearer token-{t}"})
                r = conn.getresponse()
                body = r.read()
                if r.status != 200:
                    errors.append(body.decode())
                    continue
                for i, label in zip(picks.tolist(), json.loads(body)["labels"]):
                    if answers[t].setdefault(i, label) != label:
                        errors.append(f"input {i} changed its answer")
        except Exception as exc:  # surfaced by the assertion below
            errors.append(repr(exc))
        finally:
            conn.close()

    started = time.monotonic()
    with server(run_dir, "--epsilon", "0.5", "--memo", str(memo), "--api-keys", str(keys)) as url:
        threads = [threading.Thread(target=client, args=(t, url)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=120)
        assert not any(th.is_alive() for th in threads)
    assert time.monotonic() - started < 120
    assert not errors, errors[:3]
    merged: dict[int, str] = {}
    for a in answers:
        for i, label in a.items():
            assert merged.setdefault(i, label) == label
    from lucid.access import LabelOnlyClassifier

    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=0.5, memo=memo)
    xn = clf.to_network_space(np.asarray(pool))
    noised = clf.decide(xn)[1]
    asked = sorted(merged)
    # Every input that was asked is in the memo (none lost), released ones too, nothing else.
    assert len(clf.memo) == len(asked) and 0 < noised[asked].sum() < len(asked)
    # ... the memo holds exactly the answers the clients saw ...
    assert [LABELS[c] for c in clf.predict_index(np.asarray(pool)[asked], client="check")] == [merged[i] for i in asked]
    # ... and the ledger charged each client once per distinct input it asked, and the memo's
    # draws once in all.
    totals = {t.client: t for t in clf.ledger()}
    for t in range(8):
        mine = sorted(answers[t])
        assert (totals[f"c{t}"].answers, totals[f"c{t}"].noised) == (len(mine), int(noised[mine].sum()))
        assert totals[f"c{t}"].charged == pytest.approx(0.5 * len(mine))
    assert (totals["*"].answers, totals["*"].noised) == (len(asked), int(noised[asked].sum()))


def test_budget_refusals_and_the_ledger_across_a_restart(run_dir, tmp_path):
    """Per-key ledgers, a 429 at the budget whatever the branch, repeats still answered from the
    memo, and the ledger (and so the refusal) surviving a restart."""
    xn = np.random.default_rng(0).random((200, 2))
    scores = load_networks(run_dir).forward(xn)[0]
    cls, conf = scores.argmax(1), confidence(scores)
    noised = ~(conf > np.array([0.3, np.inf, -1.0])[cls])
    rel, noi = to_orig(xn[~noised]), to_orig(xn[noised])
    keys = tmp_path / "keys.txt"
    keys.write_text("alice a-token\nbob b-token\n")
    memo = tmp_path / "m.sqlite"
    args = ["--epsilon", "1", "--memo", str(memo), "--api-keys", str(keys), "--budget", "3"]
    alice, bob = {"authorization": "Bearer a-token"}, {"authorization": "Bearer b-token"}

    def ask(url, rows, who):
        return httpx.post(url + "/v1/predict", json={"inputs": rows}, headers=who)

    with server(run_dir, *args) as url:
        first = ask(url, [rel[0], noi[0]], alice).json()["labels"] + ask(url, [noi[1]], alice).json()["labels"]
        refusals = [ask(url, [rel[1]], alice), ask(url, [noi[2]], alice), ask(url, [rel[0], noi[3]], alice)]
        for r in refusals:
            assert r.status_code == 429 and set(r.json()) == {"error"} and "budget" in r.json()["error"]
            assert set(r.headers) <= ALLOWED_HEADERS
        # The refusal is the same for an input that would be released and one that would be noised.
        assert refusals[0].content == refusals[1].content == refusals[2].content
        again = ask(url, [noi[1], noi[0], rel[0]], alice)
        assert again.status_code == 200 and again.json()["labels"] == first[::-1]
        assert ask(url, [rel[5], rel[5], noi[5]], bob).status_code == 200  # bob has his own ledger
        assert ask(url, [rel[0]], {"authorization": "Bearer nope"}).status_code == 401
    with server(run_dir, *args) as url:
        assert ask(url, [noi[6]], alice).status_code == 429  # the ledger survived the restart
        assert ask(url, [rel[0], noi[0], noi[1]], alice).json()["labels"] == first
        assert ask(url, [rel[1]], bob).status_code == 200  # bob's third distinct input
        assert ask(url, [noi[7]], bob).status_code == 429
    r = subprocess.run([sys.executable, "-m", "lucid", "budget", str(run_dir), "--memo", str(memo), "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = {c["client"]: c for c in json.loads(r.stdout)["clients"]}
    assert (got["alice"]["answers"], got["alice"]["noised"], got["alice"]["refused"]) == (3, 2, 4)
    assert (got["bob"]["answers"], got["bob"]["noised"], got["bob"]["refused"]) == (3, 1, 1)
    assert got["alice"]["charged"] == 3.0 and got["alice"]["spent"] == 2.0 and got["bob"]["spent"] == 1.0
    assert (got["*"]["answers"], got["*"]["noised"]) == (6, 3)  # alice's 3 and bob's 3 draws


def test_min_response_time_holds_every_prediction_response(run_dir):
    """--min-response-ms: answers and errors alike leave no earlier than the minimum response time
    (a lower bound that a sleep guarantees; the benchmark measures the spread)."""
    import asyncio

    from lucid.access import LabelOnlyClassifier
    from lucid.access.server import ServiceOptions, create_app

    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0)

    async def check() -> None:
        transport = httpx.ASGITransport(app=create_app(clf, options=ServiceOptions(min_response_ms=60)))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            for body, status in [({"inputs": to_orig([[0.5, 0.5]])}, 200), ({"inputs": [[9.0, -4.8]]}, 422)]:
                t0 = time.perf_counter()
                assert (await client.post("/v1/predict", json=body)).status_code == status
                assert time.perf_counter() - t0 >= 0.06

    asyncio.run(check())
    with pytest.raises(Exception, match="not both"):
        create_app(clf, options=ServiceOptions(api_key="x", api_keys={"a": "y"}))
    clf.close()


def test_serve_refuses_bad_setup_with_one_line(run_dir, tmp_path, capsys, monkeypatch):
    from lucid.cli import main

    def serve(*args, env=None):
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
        with pytest.raises(SystemExit) as exit_info:
            main(["serve", *args])
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(args, exit_info.value.code, captured.out, captured.err)

    r = serve(str(run_dir), "--epsilon", "1", "--api-key-env", "LUCID_UNSET_VAR_XYZ")
    assert r.returncode == 2 and "LUCID_UNSET_VAR_XYZ" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    (run_dir / "bounds.json").unlink()
    r = serve(str(run_dir), "--epsilon", "1")
    assert r.returncode == 2 and "bounds.json" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = serve(str(tmp_path / "nowhere"), "--epsilon", "1")
    assert r.returncode == 2 and "does not exist" in r.stderr
    write_bounds(run_dir, {0: 0.1})
    r = serve(str(run_dir), "--epsilon", "-1")
    assert r.returncode == 2 and "epsilon" in r.stderr
    r = serve(str(run_dir), "--epsilon", "1", "--budget", "-1")
    assert r.returncode == 2 and "budget" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    keys = tmp_path / "keys.txt"
    for text, message in [("alice\n", "NAME TOKEN"), ("a t1\na t2\n", "twice"), ("a t\nb t\n", "another client"),
                          ("# nothing\n", "no clients"), ("a/b t\n", "letters"), ("* t\n", "letters")]:
        keys.write_text(text)
        r = serve(str(run_dir), "--epsilon", "1", "--api-keys", str(keys))
        assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, text
    r = serve(str(run_dir), "--epsilon", "1", "--api-keys", str(tmp_path / "missing.txt"))
    assert r.returncode == 2 and "cannot read" in r.stderr
    r = serve(str(run_dir), "--epsilon", "1", "--api-keys", str(keys), "--api-key-env", "X")
    assert r.returncode == 2 and "not both" in r.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        r = serve(str(run_dir), "--epsilon", "1", "--port", str(busy.getsockname()[1]))
    assert r.returncode == 2 and "cannot listen" in r.stderr
