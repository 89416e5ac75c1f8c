"""How much of the machine `lucid train` uses: networks per chunk within a memory budget, chunks in
parallel per core, and glibc's handling of freed memory."""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import sys
from itertools import pairwise

from lucid.convolution import conv2d_output_hw
from lucid.data import Dataset

MEMORY_BUDGET = 3 * 2**30  # bytes of working memory per chunk (stays under ~4 GiB with overheads)
MAX_CHUNK = 64  # cache-friendly (benchmarks/results/idle_machine.md), and a fine resume granularity


def keep_freed_memory() -> None:
    """Stop glibc from handing every freed block over 128 KiB back to the OS.

    Each training step allocates fresh activation tensors of about a megabyte; by default glibc
    maps and unmaps them every step, and the page faults cost ~40% of the training CPU time
    (measured). Freed memory then stays in the process's heap, bounded by the chunk working set.
    """

    name = ctypes.util.find_library("c")
    if not name or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt(-3, 256 * 2**20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 512 * 2**20)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc (e.g. musl): nothing to tune
        pass


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def bytes_per_network(spec: dict, input_dim: int, num_classes: int, n: int, batch_size: int) -> int:
    """Rough working memory of one network in a chunk (float32 parameters, gradients, activations)."""
    widths = [input_dim]
    n_params = 0
    if spec["type"] == "cnn":
        length, channels = input_dim, 1
        for c in spec["conv_channels"]:
            n_params += c * channels * spec["kernel_size"] + c
            length -= spec["kernel_size"] - 1
            widths.append(c * length + channels * spec["kernel_size"] * length)  # output + unfolded input
            channels = c
        widths[-1] = channels * length
        flat = channels * length
    elif spec["type"] == "cnn2d":
        conv_params, conv_widths, flat = _conv2d_sizes(spec)
        n_params += conv_params
        widths += conv_widths
    else:
        flat = input_dim
    sizes = [flat] + list(spec["hidden"]) + [num_classes]
    n_params += sum(a * b + b for a, b in pairwise(sizes))
    widths += sizes[1:]
    rows = min(batch_size, n)
    per_network = 4 * (4 * n_params + 6 * rows * sum(widths))  # float32: params/grads/copies, acts
    return per_network


def _conv2d_sizes(spec: dict) -> tuple[int, list[int], int]:
    """(parameters, activation widths, flattened output width) of a 2-D CNN's convolutions; each
    layer's width counts its output and its unfolded (im2col) input, as conv2d may build it."""
    channels, height, width = spec["input_shape"]
    n_params, widths = 0, []
    for layer in spec["conv"]:
        k = layer["kernel"]
        n_params += layer["channels"] * channels * k * k + layer["channels"]
        height, width = conv2d_output_hw(height, width, (k, k), layer["stride"], layer["pad"])
        widths.append((layer["channels"] + channels * k * k) * height * width)
        channels = layer["channels"]
    return n_params, widths, channels * height * width


def chunk_bytes(spec: dict, ds: Dataset, chunk_size: int, batch_size: int) -> int:
    per = bytes_per_network(spec, ds.input_dim, ds.num_classes, len(ds.y_train), batch_size)
    return max(1, per * chunk_size)


def default_chunk_size(spec: dict, input_dim: int, num_classes: int, n: int, batch_size: int) -> int:
    """Networks per chunk: as many as fit MEMORY_BUDGET (capped), balanced across chunks.

    Depends only on the run's shapes, never on the machine, so a resumed run (which must use
    the same chunks to be bit-identical) recomputes the same value.
    """
    per_network = bytes_per_network(spec, input_dim, num_classes, n, batch_size)
    total = n + 1
    cap = max(1, min(MAX_CHUNK, MEMORY_BUDGET // per_network))
    chunks = math.ceil(total / cap)
    return math.ceil(total / chunks)
