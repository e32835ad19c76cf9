"""What a recognized forward depends on besides its tensors: the modules' plain attributes.

The chain is recognized once (fusejit._recognize traces forward with torch.fx), and the trace
bakes in every Python value forward reads -- `x * self.scaling_factor`, `torch.clamp(x,
max=self.limit)`, a LeakyReLU's negative_slope, a convolution's padding -- and which module each
attribute names (`self.act`). ModuleWatch keeps those as they were at recognition, so that a
call after `model.scaling_factor = 3.0` or `model.act = nn.Tanh()` can recognize forward again
instead of running the old chain (the drop-in: torch._fused_forward).

Watched, for every module in the model (the model itself included): each attribute in its
__dict__ whose name does not start with "_" (PyTorch's own bookkeeping) and whose value is
plain -- None, bool, int, float, str, a list or tuple of those, or a dict of them
(`self.cfg["slope"]`) -- but `training` (mode
changes have states of their own); and the identity of each of its submodules. Tensors are not
watched here: the drop-in reads them on every call.
"""
from typing import Optional

_PLAIN = (type(None), bool, int, float, str)


def _is_plain(v) -> bool:
    return isinstance(v, _PLAIN) or (
        isinstance(v, (list, tuple)) and len(v) <= 64 and all(isinstance(e, _PLAIN) for e in v)) or (
        isinstance(v, dict) and len(v) <= 64 and all(
            isinstance(k, _PLAIN) and isinstance(e, _PLAIN) for k, e in v.items()))


def _kept(v):
    """v as kept for comparison: a list or dict copied (the live one may be changed in place)."""
    return list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v


class ModuleWatch(object):
    """The plain attributes and submodules of a model's modules at one moment (see above)."""

    def __init__(self, model, ignore=frozenset()):
        """`ignore`: (module name, attribute) pairs not watched (a change of theirs was seen
        not to change the traced forward: a step counter forward does not read)."""
        self.ignore = frozenset(ignore)
        self.last = None  # (module name, attribute) of the change changed() found last
        self._entries = []
        for name, m in model.named_modules():
            d = m.__dict__
            keys = tuple(k for k, v in d.items()
                         if not k.startswith("_") and k != "training" and _is_plain(v) and
                         (name, k) not in self.ignore)
            mods = m._modules
            self._entries.append((name, d, keys, tuple(_kept(d[k]) for k in keys), mods,
                                  tuple(mods.items())))

    def changed(self) -> Optional[str]:
        """None while every watched attribute and submodule is as it was; else what changed
        first, e.g. "attribute 'scaling_factor' of the model (2.0, now 3.0)"."""
        self.last = None
        for name, d, keys, values, mods, items in self._entries:
            if tuple(map(d.get, keys)) == values and tuple(mods.items()) == items:
                continue
            where = "submodule '%s'" % name if name else "the model"
            for k, v in zip(keys, values):
                now = d.get(k)
                if now != v and not (now is v):
                    self.last = (name, k)
                    return "attribute '%s' of %s (%r, now %r)" % (k, where, v, now)
            for (k, m), (k2, m2) in zip(items, mods.items()):
                if k != k2 or m is not m2:
                    return "submodule '%s' of %s (replaced)" % (k if k == k2 else k2, where)
            return "the submodules of %s (added or removed)" % where
        return None
