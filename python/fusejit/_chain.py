"""A chain's ops as Python data, and the chain evaluated with PyTorch's own functional ops.

`ops_of(spec)` reads a canonical spec (fusejit's own printing, from _lib.canonical_spec); `eager`
evaluates those ops with torch.nn.functional on given tensors. The PyTorch integration uses it for
shapes under torch.compile (fake tensors), and for the gradients of chains fusejit has no fused
backward for (fusejit.torch._eager_backward differentiates this eager evaluation from the saved
input). Parameters are passed in signature order (op order, weight before bias), as ChainParams
names them.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Sequence, Tuple

_ARG = re.compile(r"\s*([A-Za-z_]+)\s*=\s*(\[[^\]]*\]|[^,\)]+)\s*")


def _value(text: str) -> Any:
    text = text.strip()
    if text.startswith("["):
        return [_value(t) for t in text[1:-1].split(",")]
    if text in ("true", "false"):
        return text == "true"
    v = float(text)
    return int(v) if v.is_integer() and "." not in text and "e" not in text.lower() else v


def _triple(v) -> Tuple[int, int, int]:
    return tuple(v) if isinstance(v, list) else (v, v, v)


def ops_of(spec: str) -> List[Tuple[str, Dict[str, Any]]]:
    """[(name, args)] of a canonical spec "x:f32[...] | op(args) | ...", defaults filled in."""
    parts = [p.strip() for p in spec.split("|")[1:]]
    ops = []
    for p in parts:
        name, _, rest = p.partition("(")
        args = {}  # type: Dict[str, Any]
        if rest:
            body = rest[:-1]
            pos = 0
            while pos < len(body):
                m = _ARG.match(body, pos)
                if not m:
                    raise ValueError("cannot read op arguments %r" % p)
                args[m.group(1)] = _value(m.group(2))
                pos = m.end() + (1 if m.end() < len(body) and body[m.end()] == "," else 0)
        name = name.strip()
        if name in ("conv3d", "conv_transpose3d"):
            args.setdefault("stride", 1)
            args.setdefault("padding", 0)
            args.setdefault("dilation", 1)
            args.setdefault("output_padding", 0)
            args.setdefault("bias", True)
            for key in ("k", "stride", "padding", "dilation", "output_padding"):
                args[key] = _triple(args[key])
        elif name == "leaky_relu":
            args.setdefault("slope", 0.01)
        elif name == "hardtanh":
            args.setdefault("min", -1.0)
            args.setdefault("max", 1.0)
        elif name == "group_norm":
            args.setdefault("eps", 1e-5)
        elif name == "softplus":
            args.setdefault("beta", 1.0)
            args.setdefault("threshold", 20.0)
        elif name in ("elu", "celu"):
            args.setdefault("alpha", 1.0)
        ops.append((name, args))
    return ops


def param_count(ops) -> int:
    n = 0
    for name, args in ops:
        if name in ("conv3d", "conv_transpose3d"):
            n += 2 if args["bias"] else 1
        elif name == "group_norm":
            n += 2
    return n


def eager(ops, x, params: Sequence[Any]):
    """The chain evaluated with PyTorch's functional ops (PyTorch's semantics by definition)."""
    import torch
    import torch.nn.functional as F

    it = iter(params)
    for name, a in ops:
        if name == "conv3d" or name == "conv_transpose3d":
            w = next(it)
            b = next(it) if a["bias"] else None
            if name == "conv3d":
                x = F.conv3d(x, w, b, stride=a["stride"], padding=a["padding"],
                             dilation=a["dilation"])
            else:
                x = F.conv_transpose3d(x, w, b, stride=a["stride"], padding=a["padding"],
                                       output_padding=a["output_padding"], dilation=a["dilation"])
        elif name == "relu":
            x = torch.relu(x)
        elif name == "leaky_relu":
            x = F.leaky_relu(x, a["slope"])
        elif name == "sigmoid":
            x = torch.sigmoid(x)
        elif name == "tanh":
            x = torch.tanh(x)
        elif name in ("swish", "silu"):
            x = x * torch.sigmoid(x)
        elif name == "hardswish":
            x = F.hardswish(x)
        elif name == "gelu":
            x = F.gelu(x)
        elif name == "clamp":
            x = torch.clamp(x, a.get("min"), a.get("max"))
        elif name == "hardtanh":
            x = F.hardtanh(x, a["min"], a["max"])
        elif name == "mul":
            x = x * a["by"]
        elif name == "add":
            x = x + a["by"]
        elif name == "mish":
            x = F.mish(x)
        elif name == "softplus":
            x = F.softplus(x, a["beta"], a["threshold"])
        elif name == "elu":
            x = F.elu(x, a["alpha"])
        elif name == "selu":
            x = F.selu(x)
        elif name == "hardsigmoid":
            x = F.hardsigmoid(x)
        elif name == "gelu_tanh":
            x = F.gelu(x, approximate="tanh")
        elif name == "logsigmoid":
            x = F.logsigmoid(x)
        elif name == "softsign":
            x = F.softsign(x)
        elif name == "tanhshrink":
            x = F.tanhshrink(x)
        elif name == "celu":
            x = F.celu(x, a["alpha"])
        elif name == "group_norm":
            w = next(it)
            b = next(it)
            x = F.group_norm(x, int(a["groups"]), w, b, a["eps"])
        elif name == "mean":
            x = x.mean(dim=list(a["dims"]))
        else:
            raise ValueError("unknown op %r" % name)
    return x
