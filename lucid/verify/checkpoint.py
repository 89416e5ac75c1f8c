"""The branch-and-bound checkpoint: RUN/verify.checkpoint.json, rewritten atomically after every
solved node, so a run killed at any moment (even kill -9) resumes from its last solved node.

It records the queue (every pending, in-flight and solved-but-open node with its network set and
bound), each class's best replayed lower bound and counters, the elapsed time, the options that
determine the result, and a fingerprint of the run's networks so a checkpoint is never applied to
a different run. In-flight nodes are stored as pending: their MILPs are redone after a resume.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from lucid.atomic import write_json_atomic
from lucid.errors import LucidError

CHECKPOINT_FILE = "verify.checkpoint.json"
CHECKPOINT_FORMAT = "lucid-bab-checkpoint/1"
# Options added after the format was fixed: a checkpoint without them was made with these values.
OPTION_DEFAULTS = {"rel_gap": 0.0, "hyper": "loo", "regions": 1, "public_inputs": None}


def run_fingerprint(run_dir: Path) -> str:
    """sha256 over run.json and networks.safetensors: identifies the exact networks verified."""
    h = hashlib.sha256()
    for name in ("run.json", "networks.safetensors"):
        with open(run_dir / name, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def save_checkpoint(
    path: Path, *, fingerprint: str, options: dict, elapsed: float, classes: dict, extra: dict | None = None
) -> None:
    """`extra`: more top-level entries (a --regions run's tree and leaks)."""
    write_json_atomic(
        path,
        {
            "format": CHECKPOINT_FORMAT,
            "run_fingerprint": fingerprint,
            "options": options,
            "elapsed": elapsed,
            "classes": classes,
            **(extra or {}),
        },
    )


def load_checkpoint(path: Path, *, fingerprint: str, options: dict) -> dict:
    """Read and validate a checkpoint; any mismatch or damage is a one-line LucidError."""
    if not path.exists():
        raise LucidError(f"nothing to resume: {path} does not exist (run without --resume first)")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LucidError(f"checkpoint {path} is corrupt ({exc}); delete it and run without --resume") from None
    if not isinstance(obj, dict) or obj.get("format") != CHECKPOINT_FORMAT:
        raise LucidError(f"{path} is not a {CHECKPOINT_FORMAT} checkpoint; delete it and run without --resume")
    if obj.get("run_fingerprint") != fingerprint:
        raise LucidError(
            f"checkpoint {path} belongs to different networks (run.json or networks.safetensors changed); "
            "delete it and run without --resume"
        )
    saved = obj.get("options")
    if isinstance(saved, dict):
        saved = {**{k: v for k, v in OPTION_DEFAULTS.items() if k in options}, **saved}
    if saved != options:
        diff = sorted(k for k in set(saved or {}) | set(options) if (saved or {}).get(k) != options.get(k))
        detail = ", ".join(f"{k}: checkpoint {(saved or {}).get(k)!r} vs now {options.get(k)!r}" for k in diff)
        raise LucidError(f"--resume with different options than the checkpoint ({detail})")
    if not isinstance(obj.get("classes"), dict) or not isinstance(obj.get("elapsed"), (int, float)):
        raise LucidError(f"checkpoint {path} is corrupt (missing classes/elapsed); delete it and run without --resume")
    return obj
