"""The extension's operator bindings (tessera._C), which come from one wrapper template: argument
names (keywords and error messages from one list), view tuples, None for required, optional and
allocated tensors. CPU only: every call here is refused by the library's device check (or by the
conversion of an argument) before anything touches a GPU, so they run on any machine.
"""

import pytest

import tessera
from tessera import _C

CPU_DEVICE_MSG = "expected a CUDA tensor, got a tensor on cpu"


def cpu_view(shape, dtype="float32"):
    """A view tuple of a tensor on no CUDA device (device index -1): the library refuses it for
    its device before reading the pointer."""
    strides, step = [], 1
    for s in reversed(shape):
        strides.insert(0, step)
        step *= s
    fields = dict(data_ptr=0, dtype=_C.DTYPES[dtype], shape=tuple(shape), strides=tuple(strides),
                  device_index=-1)
    return tuple(fields[f] for f in _C.VIEW_FIELDS)


X = cpu_view((4, 8))
W = cpu_view((8,))
STATS = cpu_view((4,))

# op -> its arguments by name, in the binding's order (the Python signatures tessera's modules call
# positionally), and the tensor argument the library names first.
CALLS = {
    "gelu": (dict(input=X, out=None, tanh=False, stream=0), "input"),
    "gelu_backward": (dict(grad_output=X, input=X, out=None, tanh=True, stream=0), "input"),
    "softmax": (dict(input=X, out=None, dim=-1, stream=0), "input"),
    "log_softmax": (dict(input=X, out=None, dim=-1, stream=0), "input"),
    "softmax_backward": (dict(grad_output=X, output=X, out=None, dim=-1, stream=0), "grad_output"),
    "log_softmax_backward": (dict(grad_output=X, output=X, out=None, dim=-1, stream=0), "grad_output"),
    "layer_norm": (dict(input=X, normalized_ndim=1, weight=W, bias=W, eps=1e-5, out=None, mean=None,
                        rstd=None, stream=0), "input"),
    "layer_norm_backward": (dict(grad_output=X, input=X, normalized_ndim=1, mean=STATS, rstd=STATS,
                                 weight=W, grad_input=X, grad_weight=W, grad_bias=W, stream=0),
                            "input"),
    "rms_norm": (dict(input=X, normalized_ndim=1, weight=None, eps=1e-6, weight_offset=0.0, out=None,
                      rstd=None, stream=0), "input"),
    "rms_norm_backward": (dict(grad_output=X, input=X, normalized_ndim=1, rstd=STATS, weight=None,
                               weight_offset=0.0, grad_input=X, grad_weight=None, stream=0), "input"),
    "dropout": (dict(input=X, out=None, p=0.5, seed=1, offset=0, stream=0), "input"),
    "dropout_backward": (dict(grad_output=X, out=None, p=0.5, seed=1, offset=0, stream=0),
                         "grad_output"),
    "copy": (dict(src=X, dst=X, stream=0), "src"),
    "isin": (dict(elements=X, test_elements=X, out=None, assume_unique=False, invert=False,
                  path="automatic", brute_force_max_test=1024, brute_force_max_work=1 << 26,
                  hash_min_test=1, stream=0), "elements"),
}


@pytest.mark.parametrize("op", sorted(CALLS))
def test_cpu_views_get_the_device_error_naming_the_argument(op):
    args, first = CALLS[op]
    with pytest.raises(ValueError) as e:
        getattr(_C, op)(*args.values())
    assert str(e.value) == f"tessera.{op}: argument '{first}': {CPU_DEVICE_MSG}"


@pytest.mark.parametrize("op", sorted(CALLS))
def test_keywords_are_the_argument_names(op):
    args, first = CALLS[op]
    with pytest.raises(ValueError, match=f"argument '{first}': {CPU_DEVICE_MSG}"):
        getattr(_C, op)(**args)


def test_a_missing_required_tensor_is_named():
    with pytest.raises(TypeError, match=r"tessera\.softmax_backward: argument 'output': expected a "
                                        r"tensor.*got NoneType"):
        _C.softmax_backward(X, None, None, -1, 0)
    with pytest.raises(TypeError, match=r"tessera\.copy: argument 'dst'.*got NoneType"):
        _C.copy(X, None, 0)
    with pytest.raises(TypeError, match=r"tessera\.layer_norm_backward: argument 'mean'.*NoneType"):
        _C.layer_norm_backward(X, X, 1, None, STATS, None, None, None, None, 0)


def test_arguments_convert_in_order():
    # A bad tensor after a CPU one: the conversion of the bad one fails first (conversions run
    # before the library's checks), and an earlier bad one wins over a later one.
    with pytest.raises(TypeError, match=r"argument 'out'.*got str"):
        _C.softmax(X, "out", -1, 0)
    with pytest.raises(TypeError, match=r"argument 'weight'.*got str"):
        _C.layer_norm(X, 1, "w", "b", 1e-5, None, None, None, 0)


def test_view_tuple_layout_is_the_extensions():
    with pytest.raises(TypeError) as e:
        _C.gelu((0, 0, (4,)), None, False, 0)
    assert str(e.value) == (f"tessera.gelu: argument 'input': expected a view tuple "
                            f"({', '.join(_C.VIEW_FIELDS)}), got a tuple of 3 items")
    with pytest.raises(TypeError, match=r"argument 'input': expected shape and strides as tuples"):
        _C.gelu((0, 0, (4,), (1, 1), -1), None, False, 0)


def test_unrepresentable_dtype_on_cuda_is_refused_by_name():
    fields = dict(data_ptr=0, dtype="complex64", shape=(4,), strides=(1,), device_index=0)
    view = tuple(fields[f] for f in _C.VIEW_FIELDS)
    with pytest.raises(TypeError, match=r"tessera\.gelu: argument 'input': expected a dtype tessera "
                                        r"supports .*got complex64"):
        _C.gelu(view, None, False, 0)


def test_isin_path_is_checked():
    e = cpu_view((4,), "int32")
    with pytest.raises(ValueError, match=r"tessera\.isin: argument 'path'"):
        _C.isin(e, e, e, False, False, "fastest", 1024, 1 << 26, 1, 0)


def test_dtype_names_are_checked_once_for_all():
    for call in (lambda: _C.isin_choose_path("float8", 1, 1, 1, 1, 1),
                 lambda: _C.DeviceArray([4], "float8")):
        with pytest.raises(TypeError, match=r"argument 'dtype': expected a tessera dtype name, "
                                            r"got 'float8'"):
            call()
    assert tessera.set.isin_path("int32", 1 << 10, 1 << 10) == "brute_force"
