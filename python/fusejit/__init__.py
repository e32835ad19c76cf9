"""fusejit: fused, shape-specialized GPU kernels for op chains (conv3d / conv_transpose3d ->
elementwise -> group_norm -> mean), compiled at run time with NVRTC and cached.

    import fusejit.torch
    ModelNew = fusejit.torch.fused(Model)     # PyTorch drop-in (see fusejit.torch)

    chain = fusejit.Chain("x:f32[2,3,8,8,8] | conv3d(out=4,k=3) | relu")   # the C ABI, by hand
    chain.signature, chain.workspace_bytes, chain.run({"x": ptr, ...}, stream)
    grads = fusejit.Chain(spec, backward=True)   # its backward: grad_y -> grad_x, grad_<param>

The package is pure Python over libfusejit.so's C ABI (ctypes): it finds the library next to
itself (where `pip install` puts it) or at $FUSEJIT_LIBRARY. `import fusejit` does not import torch.
"""
from ._lib import (Chain, FusejitError, TensorSpec, cache_dir, canonical_spec, library_path,
                   version)

__version__ = "0.1.0"
__all__ = ["Chain", "FusejitError", "TensorSpec", "cache_dir", "canonical_spec", "library_path",
           "version"]
