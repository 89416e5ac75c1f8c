"""Render `lucid report` for a run and photograph it with headless Chromium.

    python benchmarks/report_screenshot.py [RUN] [--height 3000] [--work DIR]

Without RUN it builds a `lucid demo`-sized run itself (breast cancer, 2x10, 50 epochs, HiGHS for
at most --time-limit seconds), answers a few queries for two clients so the report has a ledger,
and runs the default baselines (skip with --no-baselines). It writes

  benchmarks/results/report.png           the screenshot (1200 px wide, --height px tall)
  benchmarks/results/report.md (+ .png)   the same report as Markdown, its figures beside it

and leaves the HTML in the work folder. Without Chromium (`apt-get install -y chromium`) it
writes the reports, says so and exits 0.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def lucid(*args: object) -> None:
    cmd = [sys.executable, "-m", "lucid", *map(str, args)]
    print("$ lucid " + " ".join(map(str, args)), flush=True)
    subprocess.run(cmd, check=True)


def build_run(work: Path, time_limit: float, baselines: bool) -> Path:
    """A demo-sized run: trained, verified, served to two clients, with baseline results."""
    import numpy as np

    from lucid.access import ClassifierOptions, LabelOnlyClassifier
    from lucid.verify import verify_run
    from lucid.training import train_run

    run = work / "run"
    train_run("sklearn:breast_cancer", run, arch="2x10", epochs=50, lr=0.1, weight_decay=1e-5, batch_size=64,
              seed=0, test_fraction=0.2, progress=False)
    if not (run / "bounds.json").exists():
        verify_run(run, solver="highs", time_limit=time_limit, workers=2, progress=False)
    memo = run / "memo.sqlite"
    if not memo.exists():
        x = np.load(run / "data.npz")["X_test"].astype(np.float64)
        clf = LabelOnlyClassifier.from_run(run, epsilon=1.0, memo=memo, options=ClassifierOptions(seed=0))
        clf.predict_network_space(x[:60], client="alice")
        clf.predict_network_space(x[40:110], client="bob")
        clf.close()
    if baselines and not (run / "baselines.json").exists():
        subprocess.run([sys.executable, "-m", "lucid.baselines", str(run), "--epsilon", "0.2,1",
                        "--json", str(run / "baselines.json")], check=True)
    return run


def screenshot(html: Path, png: Path, height: int) -> bool:
    browser = next((b for b in map(shutil.which, BROWSERS) if b), None)
    if browser is None:
        print("no chromium found (apt-get update && apt-get install -y chromium): skipping the screenshot")
        return False
    png.parent.mkdir(parents=True, exist_ok=True)
    tmp = png.with_name(f".{png.name}.tmp.png")
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--screenshot={tmp}",
           f"--window-size=1200,{height}", html.resolve().as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not tmp.exists():
        print(f"chromium failed ({done.returncode}): {done.stderr.strip()[-500:]}")
        return False
    tmp.replace(png)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", nargs="?", type=Path, help="a verified run directory [default: build a demo-sized one]")
    ap.add_argument("--work", type=Path, default=Path("/tmp/lucid-report-screenshot"), help="folder for the built run")
    ap.add_argument("--time-limit", type=float, default=180.0, help="verification seconds of the built run")
    ap.add_argument("--no-baselines", action="store_true", help="do not train the baselines for the built run")
    ap.add_argument("--height", type=int, default=3000, help="screenshot height in pixels")
    ap.add_argument("--out", type=Path, default=RESULTS / "report.png", help="the screenshot")
    args = ap.parse_args()

    started = time.monotonic()
    run = args.run if args.run is not None else build_run(args.work, args.time_limit, not args.no_baselines)
    html = (args.work if args.run is None else run) / "report.html"
    lucid("report", run, "--out", html, "--epsilon", "0,0.2,1")
    lucid("report", run, "--out", args.out.with_suffix(".md"), "--epsilon", "0,0.2,1")
    if screenshot(html, args.out, args.height):
        print(f"wrote {args.out} ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
