"""ctypes binding of libfusejit.so's C ABI (include/fusejit/fusejit_c.h).

No torch and no Python-version-specific code here: one package serves every Python >= 3.9.
The library is found at $FUSEJIT_LIBRARY, else next to this file (where `pip install` puts it),
else in the source tree's build/ folder (for development).
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Dict, List, Optional, Sequence

ABI_VERSION = 1  # FUSEJIT_C_ABI_VERSION: the library must have exactly this one
ABI_MINOR = 2  # FUSEJIT_C_ABI_MINOR this package was written for (1: fj_compile_backward,
#                2: fj_compile_training_forward and fj_compile_backward_saved)

# FJ_ROLE_* (fusejit_c.h): the forward's x, y, parameters and workspace; the backward's grad_y
# (read), grad_x and grad_<param> (written); ROLE_SAVED: the u a training forward writes and its
# backward reads (Chain(..., saved=True)).
ROLE_INPUT, ROLE_OUTPUT, ROLE_PARAM, ROLE_WORKSPACE = 0, 1, 2, 3
ROLE_GRAD_OUTPUT, ROLE_GRAD_INPUT, ROLE_GRAD_PARAM, ROLE_SAVED = 4, 5, 6, 7
ROLE_NAMES = ("input", "output", "param", "workspace", "grad_output", "grad_input", "grad_param",
              "saved")  # fj_role_name's, by role
DTYPES = ("f32", "f16", "bf16", "f64")  # FJ_DTYPE_* order


class FusejitError(RuntimeError):
    """A failure reported by libfusejit; the message says what was wrong and what would be right."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class _CompileOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("arch", ctypes.c_char_p),
        ("device", ctypes.c_int),
        ("precision", ctypes.c_char_p),
        ("strategy", ctypes.c_char_p),
        ("tune_config", ctypes.c_char_p),
        ("disable_cache", ctypes.c_int),
        ("disable_tuning", ctypes.c_int),
    ]


class _TensorInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("role", ctypes.c_int),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.c_int64 * 8),
        ("bytes", ctypes.c_size_t),
        ("alignment", ctypes.c_size_t),
    ]


def _candidates() -> List[str]:
    here = os.path.dirname(os.path.abspath(__file__))
    paths = []
    env = os.environ.get("FUSEJIT_LIBRARY")
    if env:
        return [env]  # an explicit choice is the only one tried
    for name in ("libfusejit.so.0", "libfusejit.so"):
        paths.append(os.path.join(here, name))
    root = os.path.dirname(os.path.dirname(here))  # source tree: python/fusejit -> repo root
    for name in ("libfusejit.so.0", "libfusejit.so"):
        paths.append(os.path.join(root, "build", name))
    return paths


_lib = None
_lib_path = None
_lib_lock = threading.Lock()


def _declare(lib):
    c = ctypes
    P = c.POINTER
    sig = {
        "fj_abi_version": ([], c.c_int),
        "fj_version": ([], c.c_char_p),
        "fj_last_error": ([], c.c_char_p),
        "fj_canonical_spec": ([c.c_char_p, P(c.c_char_p)], c.c_int),
        "fj_cache_dir": ([P(c.c_char_p)], c.c_int),
        "fj_compile": ([c.c_char_p, P(_CompileOptions), P(c.c_void_p)], c.c_int),
        "fj_chain_release": ([c.c_void_p], c.c_int),
        "fj_chain_spec": ([c.c_void_p, P(c.c_char_p)], c.c_int),
        "fj_chain_strategy": ([c.c_void_p, P(c.c_char_p)], c.c_int),
        "fj_chain_explain": ([c.c_void_p, P(c.c_char_p)], c.c_int),
        "fj_chain_workspace_bytes": ([c.c_void_p, P(c.c_size_t)], c.c_int),
        "fj_chain_tensor_count": ([c.c_void_p, P(c.c_size_t)], c.c_int),
        "fj_chain_tensor": ([c.c_void_p, c.c_size_t, P(_TensorInfo)], c.c_int),
        "fj_chain_load": ([c.c_void_p, c.c_int], c.c_int),
        "fj_chain_run": ([c.c_void_p, P(c.c_char_p), P(c.c_uint64), c.c_size_t, c.c_void_p,
                          c.c_int], c.c_int),
        "fj_chain_run_tensors": ([c.c_void_p, P(c.c_uint64), c.c_size_t, c.c_void_p, c.c_int],
                                 c.c_int),
    }
    for name, (args, res) in sig.items():
        f = getattr(lib, name)
        f.argtypes = args
        f.restype = res
    # ABI minor 1. A library without them (built before the backward) still serves the forward:
    # has_backward() says whether it has them, and Chain(..., backward=True) refuses without them.
    optional = {
        "fj_abi_minor": ([], c.c_int),
        "fj_compile_backward": ([c.c_char_p, P(_CompileOptions), P(c.c_void_p)], c.c_int),
        "fj_role_name": ([c.c_int], c.c_char_p),
        # ABI minor 2 (has_training()).
        "fj_compile_training_forward": ([c.c_char_p, P(_CompileOptions), P(c.c_void_p)],
                                        c.c_int),
        "fj_compile_backward_saved": ([c.c_char_p, P(_CompileOptions), P(c.c_void_p)], c.c_int),
    }
    for name, (args, res) in optional.items():
        f = getattr(lib, name, None)
        if f is not None:
            f.argtypes = args
            f.restype = res


def library():
    """The loaded libfusejit.so (loaded on first use). Raises FusejitError when it cannot be."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        errors = []
        for path in _candidates():
            if not os.path.exists(path):
                errors.append("%s: not found" % path)
                continue
            try:
                lib = ctypes.CDLL(path)
                _declare(lib)
            except (OSError, AttributeError) as e:
                errors.append("%s: %s" % (path, e))
                continue
            if lib.fj_abi_version() != ABI_VERSION:
                errors.append("%s: C ABI version %d, this package needs %d" %
                              (path, lib.fj_abi_version(), ABI_VERSION))
                continue
            _lib, _lib_path = lib, path
            return lib
        raise FusejitError(5, "cannot load libfusejit.so (set FUSEJIT_LIBRARY to its path, or "
                              "install the package with `pip install ./python`): " +
                           "; ".join(errors))


def library_path() -> Optional[str]:
    library()
    return _lib_path


def abi_minor() -> int:
    """The loaded library's C ABI minor (0 for one from before fj_abi_minor)."""
    lib = library()
    return lib.fj_abi_minor() if hasattr(lib, "fj_abi_minor") else 0


def has_backward() -> bool:
    """Whether the loaded library compiles backward passes (fj_compile_backward, ABI minor 1)."""
    return hasattr(library(), "fj_compile_backward")


def has_training() -> bool:
    """Whether the loaded library compiles training forwards that save the convolution's output
    and backwards that read it (ABI minor 2)."""
    lib = library()
    return hasattr(lib, "fj_compile_training_forward") and hasattr(lib, "fj_compile_backward_saved")


def _check(code: int) -> None:
    if code != 0:
        raise FusejitError(code, library().fj_last_error().decode("utf-8", "replace"))


def version() -> str:
    return library().fj_version().decode()


def canonical_spec(spec: str) -> str:
    """The canonical text of `spec` (raises FusejitError naming the problem if it is invalid)."""
    out = ctypes.c_char_p()
    _check(library().fj_canonical_spec(spec.encode(), ctypes.byref(out)))
    return out.value.decode()


def cache_dir() -> str:
    out = ctypes.c_char_p()
    _check(library().fj_cache_dir(ctypes.byref(out)))
    return out.value.decode()


class TensorSpec(object):
    __slots__ = ("name", "role", "dtype", "shape", "bytes", "alignment")

    def __init__(self, name, role, dtype, shape, nbytes, alignment):
        self.name, self.role, self.dtype = name, role, dtype
        self.shape, self.bytes, self.alignment = shape, nbytes, alignment

    @property
    def role_name(self) -> str:
        """"input", "param", "grad_input", ... (ROLE_NAMES)."""
        return ROLE_NAMES[self.role] if 0 <= self.role < len(ROLE_NAMES) else "role %d" % self.role

    def __repr__(self):
        return "TensorSpec(%s, %s, %s%s)" % (self.name, self.role_name, self.dtype,
                                             list(self.shape))


class Chain(object):
    """A compiled chain (a handle of the C ABI). Released when garbage collected or by release().

    backward=True compiles the chain's backward pass (fj_compile_backward) instead: its signature
    is x, the parameters, grad_y (read), grad_x and grad_<param> for every parameter (written in
    full, deterministically), then the workspace; run it like a forward chain. Raises FusejitError
    with code 12 (FJ_UNIMPLEMENTED) for a chain without a backward plan (f64) or a library
    without fj_compile_backward.

    saved=True (ABI minor 2) compiles the training pair instead: with backward=False the forward
    that also writes "u" (role SAVED: the convolution's output, shaped as its signature says --
    [N, C, D, H, W] or the [N, D, H, C, W] layout some plans store faster) where saving it pays
    (fj_compile_training_forward; else the plain forward, no SAVED tensor), with backward=True the
    backward reading that u after grad_y (fj_compile_backward_saved)."""

    def __init__(self, spec: str, arch: Optional[str] = None, device: int = 0,
                 precision: str = "fp32", strategy: Optional[str] = None,
                 tune_config: Optional[str] = None, use_cache: bool = True,
                 use_tuning: bool = True, backward: bool = False, saved: bool = False):
        lib = library()
        self._handle = None
        compile_fn = lib.fj_compile
        if saved:
            name = "fj_compile_backward_saved" if backward else "fj_compile_training_forward"
            compile_fn = getattr(lib, name, None)
            if compile_fn is None:
                raise FusejitError(12, "the libfusejit.so loaded (%s) has no %s (C ABI minor %d, "
                                       "training needs 2): rebuild or reinstall it"
                                   % (_lib_path, name, abi_minor()))
        elif backward:
            compile_fn = getattr(lib, "fj_compile_backward", None)
            if compile_fn is None:
                raise FusejitError(12, "the libfusejit.so loaded (%s) has no fj_compile_backward "
                                       "(C ABI minor %d, the backward needs %d): rebuild or "
                                       "reinstall it" % (_lib_path, abi_minor(), ABI_MINOR))
        opts = _CompileOptions()
        opts.struct_size = ctypes.sizeof(_CompileOptions)
        opts.arch = arch.encode() if arch else None
        opts.device = int(device)
        opts.precision = precision.encode() if precision else None
        opts.strategy = strategy.encode() if strategy else None
        opts.tune_config = tune_config.encode() if tune_config else None
        opts.disable_cache = 0 if use_cache else 1
        opts.disable_tuning = 0 if use_tuning else 1
        handle = ctypes.c_void_p()
        self._lib = lib
        _check(compile_fn(spec.encode(), ctypes.byref(opts), ctypes.byref(handle)))
        self._handle = handle
        self.backward = bool(backward)
        self.saved = bool(saved)
        self.device = int(device)
        out = ctypes.c_char_p()
        _check(lib.fj_chain_spec(handle, ctypes.byref(out)))
        self.spec = out.value.decode()
        _check(lib.fj_chain_strategy(handle, ctypes.byref(out)))
        self.strategy = out.value.decode()
        n = ctypes.c_size_t()
        _check(lib.fj_chain_workspace_bytes(handle, ctypes.byref(n)))
        self.workspace_bytes = n.value
        _check(lib.fj_chain_tensor_count(handle, ctypes.byref(n)))
        self.signature = []  # type: List[TensorSpec]
        info = _TensorInfo()
        for i in range(n.value):
            _check(lib.fj_chain_tensor(handle, i, ctypes.byref(info)))
            self.signature.append(TensorSpec(info.name.decode(), info.role, DTYPES[info.dtype],
                                             tuple(info.shape[:info.ndim]), info.bytes,
                                             info.alignment))
        # The run fast path, resolved once: the entry point and the pointer array type.
        self._run_tensors = lib.fj_chain_run_tensors
        self._array = ctypes.c_uint64 * len(self.signature)

    def explain(self) -> str:
        out = ctypes.c_char_p()
        _check(self._lib.fj_chain_explain(self._handle, ctypes.byref(out)))
        return out.value.decode()

    def tensor(self, name: str) -> TensorSpec:
        for t in self.signature:
            if t.name == name:
                return t
        raise KeyError(name)

    def load(self) -> None:
        """Loads the module into the current context (needed before CUDA graph capture)."""
        _check(self._lib.fj_chain_load(self._handle, self.device))

    def run_pointers(self, pointers: Sequence[int], stream: int = 0) -> None:
        """Enqueues the chain with one device pointer per signature tensor, in signature order."""
        code = self._run_tensors(self._handle, self._array(*pointers), len(pointers), stream,
                                 self.device)
        if code:
            _check(code)

    def run(self, bindings: Dict[str, int], stream: int = 0) -> None:
        """Enqueues the chain with pointers bound by name ({"x": ptr, "y": ptr, ...})."""
        names = (ctypes.c_char_p * len(bindings))(*[k.encode() for k in bindings])
        ptrs = (ctypes.c_uint64 * len(bindings))(*[int(v) for v in bindings.values()])
        _check(self._lib.fj_chain_run(self._handle, names, ptrs, len(bindings),
                                      ctypes.c_void_p(stream), self.device))

    def release(self) -> None:
        if getattr(self, "_handle", None) is not None:
            _check(self._lib.fj_chain_release(self._handle))
            self._handle = None

    def __del__(self):
        try:
            self.release()
        except Exception:  # interpreter shutdown: nothing to report to
            pass
