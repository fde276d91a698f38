"""tessera: GPU operators written in CUDA C++, tile by tile, with torch's signatures.

    import torch, tessera
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = tessera.gelu(x, approximate="tanh")        # torch.nn.functional.gelu; differentiable
    z = tessera.add(y, x, alpha=0.5)               # torch.add, with broadcasting
    p = tessera.softmax(z, dim=-1)                 # torch.softmax; also log_softmax
    h = tessera.layer_norm(z, (4096,), w, b)       # torch.nn.functional.layer_norm; rms_norm
    h, z = tessera.add_rms_norm(h, z, w)           # z = h + z, then rms_norm(z), in one pass
    d = tessera.dropout(h, 0.1)                    # seeded by tessera.random (manual_seed, ...)
    o = tessera.linear(d, w2, b2, activation="gelu")  # F.linear with a fused activation; matmul
    f = tessera.mlp(h, w13, w2)                    # linear(linear(h, w13, activation="swiglu"), w2)
    a = tessera.scaled_dot_product_attention(q, k, v, is_causal=True)  # also flash_attention

Inputs are torch tensors (zero-copy, on torch's current stream) or any CUDA array that speaks
DLPack (cupy arrays come back as cupy arrays). Errors are the library's own messages, raised as
ValueError (shapes, devices, overlap), TypeError (dtypes) or RuntimeError (CUDA failures).

Submodules: ``tessera.random`` (dropout's generator: manual_seed, get_rng_state, set_rng_state),
``tessera.bench`` (do_bench, peaks, Report), ``tessera.float8`` (float8 training recipes:
convert_to_float8_training, Float8Linear, quantize), ``tessera.post_training`` (TRL's losses).
The ``tessera`` command (verify, bench, profile on the local GPU) is installed with the package.
"""

import sys

from . import _C, _interop, _routing, attention, elementwise, float8, loss, matrix, moe, post_training, rowwise
from . import bench
from . import random
from ._C import DeviceArray
# Each family module's __all__ names its public functions once; they are tessera's.
from .elementwise import *  # noqa: F401,F403
from .matrix import *  # noqa: F401,F403
from .rowwise import *  # noqa: F401,F403
from .set import isin
from .attention import *  # noqa: F401,F403
from .loss import *  # noqa: F401,F403
from .moe import *  # noqa: F401,F403
from .post_training import *  # noqa: F401,F403
from ._routing import *  # noqa: F401,F403

__version__: str = _C.__version__

if "torch" in sys.modules:  # else on the first torch tensor (tessera never imports torch itself)
    _interop.init_ops(sys.modules["torch"])

# tessera.copy and tessera.random are left out of __all__: a star import would shadow the
# standard library's copy and random modules.
__all__ = [name for module in (elementwise, rowwise, matrix, attention, loss, moe, post_training, _routing) for name in module.__all__
           if name != "copy"] + ["isin", "set_autotune", "autotune_enabled", "bench", "DeviceArray", "is_available",
                                 "device_count", "no_gpu_reason", "__version__"]


def set_autotune(on: bool) -> None:
    """Tune the configs of ops that have them (matmul) on first use of each shape bucket, keeping
    the result in the tune cache (also the environment's TESSERA_AUTOTUNE=1). Off by default:
    configs already in the cache (``tessera tune gemm``) are used either way."""
    _C.set_autotune(bool(on))


def autotune_enabled() -> bool:
    """Whether configs are tuned on first use."""
    return _C.autotune_enabled()


def is_available() -> bool:
    """True when a CUDA GPU is usable (devices present and a working driver)."""
    return _C.device_count() > 0


def device_count() -> int:
    """Number of usable CUDA devices; 0 without a GPU or driver."""
    return _C.device_count()


def no_gpu_reason() -> str:
    """Why no GPU is usable ('no CUDA GPU present', the driver's error, ...); '' when one is."""
    return _C.no_gpu_reason()
