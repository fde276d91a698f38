"""What tessera knows of torch once torch is present: the names the public functions read per call.

tessera._torch fills them in (publish) at the end of its import, once its ops and fakes are
registered; tessera._interop imports tessera._torch the first time it sees torch (init_ops). This
module imports nothing, so neither of those modules needs the other while it loads.

Until torch is seen every name holds its empty value. ``Tensor`` is torch.Tensor; ``ops`` is
torch.ops.tessera where its library is built (None otherwise). The public functions call the
registered ops for a torch.Tensor input, a subclass too (a DTensor, which the op runs on its
shards by tessera._sharding's rules): ``type(x) is Tensor or isinstance(x, Tensor)``, the exact
type checked first, the cheaper. ``fast`` is tessera._torch_fast where built: the public
functions' calls on plain CUDA tensors (exact torch.Tensor and nn.Parameter only; the op's kernel
at once, or where autograd records the call, the registered op through the dispatcher from C++),
skipped where ``dynamo_compiling()`` (True where dynamo traces), since compiled graphs take the
registered ops. ``FAST`` maps an op's name to its index for fast.call.
"""

Tensor = None
ops = None
fast = None
FAST: dict = {}
dynamo_compiling = None
torch_module = None
FLOATS = frozenset()  # torch's float32, float16 and bfloat16: the float kernels' dtypes


def publish(torch, torch_ops, fast_module, fast_index: dict) -> None:
    """Sets the names above from tessera._torch's import; ``Tensor`` last, since it says that the
    others are set."""
    global Tensor, ops, fast, FAST, dynamo_compiling, torch_module, FLOATS
    ops, fast, FAST = torch_ops, fast_module, fast_index
    dynamo_compiling = getattr(torch.compiler, "is_dynamo_compiling", torch.compiler.is_compiling)
    torch_module = torch
    FLOATS = frozenset((torch.float32, torch.float16, torch.bfloat16))
    Tensor = torch.Tensor
