"""The public function of an op made from its declaration, the one generic mechanism behind the
ops of the generic kernel (tessera/op.hpp in the C++ library):

    @op("silu_mul")
    def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
        '''docstring'''
        return torch.nn.functional.silu(gate) * up

The declaration gives the signature (torch's, in the schema's order), the types and the docstring;
its body is torch's composition of the same contract, which takes the calls tessera's kernels do
not (CPU tensors, other dtypes, tensors of mixed dtypes or devices). Every other call takes, in
order: the no-grad fast path (tessera._torch_fast, skipped while dynamo traces), then the
registered op torch.ops.tessera.<name> (autograd in C++, fake kernel, torch.compile).
"""

from __future__ import annotations

import functools
import inspect

from . import _interop


def op(name: str):
    def make(declaration):
        signature = inspect.signature(declaration)
        names = tuple(signature.parameters)

        @functools.wraps(declaration)
        def call(*args, **kwargs):
            if kwargs:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                args = bound.args
            fast = _interop.fast
            if fast is not None and not _interop.dynamo_compiling():
                r = fast.call(_interop.FAST[name], *args)
                if r is not None:
                    return r
            tensors = [a for a in args if _interop.torch_if_tensor(a) is not None]
            if not tensors or _interop.outside_kernels(*tensors):
                return declaration(*args)
            return getattr(_interop.needs_ops(name), name).default(*args)

        call.__signature__ = signature
        call.parameters = names
        return call
    return make
