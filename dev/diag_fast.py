"""Why tessera._torch_fast would not take a call on a plain CUDA tensor: the tensor's dispatch
keys, the thread's included and excluded keys, the active modes, and takes() itself."""
import torch, tessera
from tessera import _torch
x = torch.randn(4, 4, device="cuda")
print("keys", torch._C._dispatch_keys(x))
print("tls include", torch._C._dispatch_tls_local_include_set())
print("tls exclude", torch._C._dispatch_tls_local_exclude_set())
print("tf mode", torch._C._is_torch_function_mode_enabled())
print("dispatch stack", torch._C._len_torch_dispatch_stack())
print("takes", _torch.fast.takes(x))
