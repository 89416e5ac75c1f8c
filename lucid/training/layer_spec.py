"""The layer-list form of `--arch`: `conv(8,3,stride=1,pad=1),conv(8,3,stride=2),fc(32)` with
`--input-shape C,H,W` (docs/training.md, "Architectures").

conv(out_channels, kernel, stride=1, pad=0) is a square 2-D convolution with zero padding, then
a ReLU; fc(width) a dense layer, then a ReLU; the output layer follows the last of them. Every
conv comes before every fc. The data's features are the C-H-W flattened image (torch's
`flatten(1)` order), so `--input-shape` must multiply out to the data's width (checked where the
data is known: `lucid.training.architecture.check_arch_fits`).

run.json records `{"type": "cnn2d", "spec": <the normalised spec>, "input_shape": [C, H, W],
"conv": [{"channels", "kernel", "stride", "pad"}, ...], "hidden": [fc widths]}`. A list of fc
layers alone is an MLP, recorded exactly as `--arch 20,20` is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from lucid.convolution import conv2d_output_hw, format_layer_spec
from lucid.errors import LucidError

USAGE = "use conv(out_channels, kernel, stride=1, pad=0) and fc(width), e.g. conv(8,3,pad=1),conv(8,3,stride=2),fc(32)"
_LAYER = re.compile(r"\s*([a-z_][a-z0-9_]*)\s*\(([^()]*)\)\s*(?:,|$)")
_CONV_ARGS = ("channels", "kernel", "stride", "pad")
_CONV_DEFAULTS = {"stride": 1, "pad": 0}


def is_layer_spec(arch: str) -> bool:
    """Whether `--arch` is a layer list (the other forms, 2x50, 50,20 and cnn, have no parentheses)."""
    return "(" in arch or ")" in arch


def parse_input_shape(value: str | Sequence[int] | None) -> list[int] | None:
    """`--input-shape 1,8,8` (or a sequence of three ints) -> [C, H, W]; None stays None."""
    if value is None:
        return None
    parts = value.split(",") if isinstance(value, str) else list(value)
    try:
        shape = [int(str(p).strip()) for p in parts]
    except ValueError:
        shape = []
    if len(shape) != 3 or min(shape) < 1:
        raise LucidError(
            f"--input-shape must be three positive sizes CHANNELS,HEIGHT,WIDTH (e.g. 1,8,8), got '{value}'"
        )
    return shape


def parse_layer_spec(arch: str, input_shape: list[int] | None) -> dict:
    """A layer list and the input shape -> run.json's architecture (checked layer by layer)."""
    layers = _split(arch)
    kinds = [kind for kind, _ in layers]
    if "fc" in kinds and "conv" in kinds[kinds.index("fc") :]:
        raise LucidError(f"--arch '{arch}': every conv(...) layer must come before the fc(...) layers")
    convs = [_conv_args(arch, args) for kind, args in layers if kind == "conv"]
    hidden = [_fc_width(arch, args) for kind, args in layers if kind == "fc"]
    if not convs:
        if input_shape is not None:
            raise LucidError(f"--input-shape is for conv(...) layers; --arch '{arch}' has none")
        return {"type": "mlp", "hidden": hidden}
    if input_shape is None:
        raise LucidError(
            f"--arch '{arch}' has conv(...) layers: give the image shape with --input-shape C,H,W "
            "(the features are the C-H-W flattened image)"
        )
    _check_shapes(arch, convs, input_shape)
    return {
        "type": "cnn2d",
        "spec": format_layer_spec(convs, hidden),
        "input_shape": list(input_shape),
        "conv": convs,
        "hidden": hidden,
    }


def _split(arch: str) -> list[tuple[str, str]]:
    text = arch.strip().lower()
    layers, pos = [], 0
    while pos < len(text):
        m = _LAYER.match(text, pos)
        if m is None:
            raise LucidError(f"cannot read --arch '{arch}' at '{text[pos:]}': {USAGE}")
        if m.group(1) not in ("conv", "fc"):
            raise LucidError(f"unknown layer '{m.group(1)}' in --arch '{arch}': {USAGE}")
        layers.append((m.group(1), m.group(2)))
        pos = m.end()
    if not layers or text.endswith(","):
        raise LucidError(f"cannot read --arch '{arch}': {USAGE}")
    return layers


def _conv_args(arch: str, args: str) -> dict:
    """conv's arguments as Python would bind them: positional, then stride= / pad= by name."""
    values: dict[str, int] = {}
    named = False
    for i, part in enumerate(a.strip() for a in args.split(",")):
        name, eq, value = part.partition("=")
        named = named or bool(eq)
        if not eq:
            if i >= len(_CONV_ARGS) or named:
                raise LucidError(
                    f"--arch '{arch}': conv({args}) has a positional argument after a named one or "
                    f"too many arguments; {USAGE}"
                )
            name, value = _CONV_ARGS[i], part
        name = name.strip()
        if (eq and name not in _CONV_DEFAULTS) or name in values:
            raise LucidError(f"--arch '{arch}': conv({args}) has an unknown or repeated argument '{name}'; {USAGE}")
        values[name] = _integer(arch, f"conv({args})", value)
    if "channels" not in values or "kernel" not in values:
        raise LucidError(f"--arch '{arch}': conv({args}) needs out_channels and kernel; {USAGE}")
    layer = {**_CONV_DEFAULTS, **values}
    if min(layer["channels"], layer["kernel"], layer["stride"]) < 1 or layer["pad"] < 0:
        raise LucidError(f"--arch '{arch}': conv({args}) needs out_channels, kernel and stride >= 1 and pad >= 0")
    return {k: layer[k] for k in _CONV_ARGS}


def _fc_width(arch: str, args: str) -> int:
    width = _integer(arch, f"fc({args})", args)
    if width < 1:
        raise LucidError(f"--arch '{arch}': fc({args}) needs a width >= 1")
    return width


def _integer(arch: str, layer: str, text: str) -> int:
    if not re.fullmatch(r"\s*-?\d+\s*", text):
        raise LucidError(f"--arch '{arch}': {layer} needs whole numbers, got '{text.strip()}'; {USAGE}")
    return int(text)


def _check_shapes(arch: str, convs: list[dict], input_shape: list[int]) -> None:
    """Every kernel must fit the (padded) image it slides over, layer after layer."""
    _, height, width = input_shape
    for j, c in enumerate(convs):
        try:
            height, width = conv2d_output_hw(height, width, (c["kernel"], c["kernel"]), c["stride"], c["pad"])
        except LucidError as exc:
            raise LucidError(
                f"--arch '{arch}' on --input-shape {','.join(map(str, input_shape))}: conv layer {j}: {exc}"
            ) from None
