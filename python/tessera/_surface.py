"""The public function of an op made from its declaration, the one mechanism behind the ops of the
generic kernel (their description in the C++ library, tessera/op.hpp, names a kernel):

    @op("silu_mul")
    def silu_mul(gate: TensorT, up: TensorT) -> TensorT:
        '''docstring'''
        return torch.nn.functional.silu(gate) * up

The declaration gives the signature (torch's: the schema's arguments first, in its order, then any
of tessera's own, such as ``out=``), the types and the docstring; the public function is generated
with the same parameters (so Python binds the arguments, at no cost of ours). Its body takes every call the
op's kernel does not: tensors the kernels do not take (CPU, other dtypes: there, torch's
composition of the same contract), DLPack arrays, and the arguments beyond the schema's
(``out=``, ``dtype=``) where they are not their defaults. Every other call takes, in order: the
fast path (tessera._torch_fast, skipped while dynamo traces; plain tensors only: the op's kernel at
once, or, where autograd records the call, the registered op through the dispatcher from C++),
then the registered op torch.ops.tessera.<name> (autograd in C++, fake kernel, torch.compile),
which also takes subclasses of torch.Tensor (a DTensor: the op runs on its local shards by the
sharding rules of tessera/_sharding.py; a FakeTensor: the fake kernel) on the same conditions.
The public function returns the op's outputs but its internal ones (statistics saved for the
backward: layer_norm returns out, not mean and rstd): one as itself, several as a tuple. Tensor
arguments take one float dtype, but the description's float32 statistics; an int[] argument an
int or a sequence of ints; a bool[] one a sequence of bools.
"""

from __future__ import annotations

import ast
import functools
import inspect
from typing import Any, Callable, TypeVar, cast

from . import _C, _interop, _state

F = TypeVar("F", bound=Callable[..., Any])

def generic_descriptions() -> list:
    """The descriptions with a generic kernel, overloads after their op ("add", "add.Scalar"), in
    the order the library counts them (fast.call's indices)."""
    return [d for o in _C.op_descriptions() for d in [o] + o["overloads"] if d["generic"]]


_GENERIC = generic_descriptions()
_REQUIRED = object()  # an argument without a default
_SCHEMAS = {d["name"]: d["schemas"][0] for d in _GENERIC}
# An op's index for _torch_fast.call: its place among the ops of the generic kernel, in the
# library's order (the torch ops count them in the same order; _interop checks that they agree).
_FAST_INDEX = {d["name"]: i for i, d in enumerate(_GENERIC)}


def _schema_args(schema: str) -> list:
    """(name, type, keyword-only, default) of each argument of a schema string, in order; the
    type as written ('Tensor', 'Tensor?', 'int[]', ...), the default a Python value or _REQUIRED.
    Read from the string, not from torch's FunctionSchema, so that a first call under
    torch.compile has nothing to trace but plain Python values."""
    inner = schema[schema.index("(") + 1:schema.rindex(") ->")]
    out, kwarg_only = [], False
    for part in inner.split(","):
        part = part.strip()
        if part == "*":
            kwarg_only = True
        elif part:
            decl, _, default = part.partition("=")
            kind, name = decl.split()[0], decl.split()[-1]
            out.append((name, kind, kwarg_only, ast.literal_eval(default.strip()) if default else _REQUIRED))
    return out


def op(name: str) -> Callable[[F], F]:
    schema = _SCHEMAS.get(name)
    if schema is None:
        raise ValueError(f"tessera: op {name!r} has no generic kernel in the library's descriptions")
    arguments = _schema_args(schema)
    schema_names = [a[0] for a in arguments]
    desc = next(d for d in _GENERIC if d["name"] == name)
    float32 = set(desc["float32_args"])
    rules = list(desc["output_rules"].values())
    public = [i for i, r in enumerate(rules) if not r["internal"]]
    pick = None if len(public) == len(rules) else \
        (lambda r: r[public[0]]) if len(public) == 1 else (lambda r: tuple(r[i] for i in public))
    n_pos = sum(not kw for _, _, kw, _ in arguments)
    kw_only = [(i, a, d) for i, (a, _, kw, d) in enumerate(arguments) if kw]
    kinds = [k for _, k, _, _ in arguments]

    def make(declaration: F) -> F:
        params = list(inspect.signature(declaration).parameters.values())
        names = [p.name for p in params]
        n = len(schema_names)
        if names[:n] != schema_names:
            raise TypeError(f"tessera.{name}: the declaration's parameters {names} do not start "
                            f"with the schema's {schema_names}")
        routes = []  # the registered op, looked up on first use, once torch's ops are loaded

        def route(*args):
            """The registered op where its kernel takes the arguments (tensors plain CUDA ones of
            one float dtype, numbers and names of the schema's kinds); else the declaration."""
            if not routes:
                routes.append(getattr(_state.ops, name).default)
            overload = routes[0]
            first = None
            for i, (a, kind, arg) in enumerate(zip(args, kinds, schema_names)):
                if kind == "Tensor" or kind == "Tensor?" and a is not None and a.is_floating_point():
                    # A subclass (a DTensor) too: the op dispatches it (DTensor by its sharding
                    # rules, tessera/_sharding.py); the exact type is checked first, the cheaper.
                    # Float tensors of one dtype, but for float32 statistics.
                    if (type(a) is not _state.Tensor and not isinstance(a, _state.Tensor)) or not a.is_cuda:
                        return call_declaration(*args)
                    if arg in float32:
                        if a.dtype is not _state.torch_module.float32:
                            return call_declaration(*args)
                    elif a.dtype not in _state.FLOATS or (first is not None and a.dtype is not first):
                        return call_declaration(*args)
                    else:
                        first = a.dtype
                elif kind == "int[]":  # an int, or a sequence of ints (torch.Size is a tuple)
                    if type(a) is int:
                        args = args[:i] + ((a,),) + args[i + 1:]
                    elif not isinstance(a, (tuple, list)):
                        return call_declaration(*args)
                elif kind.startswith("bool["):
                    if not isinstance(a, (tuple, list)) or not all(type(b) is bool for b in a):
                        return call_declaration(*args)
                elif kind == "int" and type(a) is not int or kind == "bool" and type(a) is not bool or \
                        kind == "str" and type(a) is not str or \
                        kind == "float" and type(a) is not float and type(a) is not int:
                    return call_declaration(*args)
            if kw_only:  # keyword arguments cost the op's parsing: only those not at their default
                kw = {k: args[i] for i, k, d in kw_only if args[i] != d}
                if kw:
                    r = overload(*args[:n_pos], **kw)
                    return r if pick is None else pick(r)
            r = overload(*args[:n_pos]) if n_pos < len(args) else overload(*args)
            return r if pick is None else pick(r)

        # The public function, generated with the declaration's own parameters, so that Python
        # binds the arguments (no binding of ours on every call).
        keyword_only = [p.name for p in params if p.kind is p.KEYWORD_ONLY]
        extras = names[n:]
        text, namespace = [], {"_interop": _interop, "_state": _state, "_route": route, "_declaration": declaration}
        for i, p in enumerate(params):
            if p.kind is p.KEYWORD_ONLY and "*" not in text:
                text.append("*")
            if p.default is p.empty:
                text.append(p.name)
            else:
                namespace[f"_d{i}"] = p.default
                text.append(f"{p.name}=_d{i}")
        schema_args = ", ".join(schema_names)
        own = " and ".join(f"{e} is _d{names.index(e)}" for e in extras) or "True"
        passed = ", ".join(e if e not in keyword_only else f"{e}={e}" for e in names)
        source = f"""
def {declaration.__name__}({", ".join(text)}):
    if _state.Tensor is None:  # torch imported after tessera: its ops loaded on first sight
        _interop.torch_if_tensor({schema_names[0]}, init=True)
    if {own}:
        fast = _state.fast
        if fast is not None and not _state.dynamo_compiling():
            r = fast.call({_FAST_INDEX[name]}, {schema_args})
            if r is not None:
                return r
        if _state.ops is not None and (type({schema_names[0]}) is _state.Tensor or
                                       isinstance({schema_names[0]}, _state.Tensor)):
            return _route({schema_args})
    return _declaration({passed})
"""
        exec(source, namespace)  # noqa: S102 (text built from the declaration's names only)
        generated = namespace[declaration.__name__]

        def call_declaration(*args):
            """The declaration on the schema's arguments (tessera's own at their defaults)."""
            positional = [a for a, p in zip(args, params) if p.kind is not p.KEYWORD_ONLY]
            kw = {p.name: a for a, p in zip(args, params) if p.kind is p.KEYWORD_ONLY}
            return declaration(*positional, **kw)

        return cast(F, functools.wraps(declaration)(generated))
    return make
