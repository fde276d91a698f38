"""tessera.grouped_mm against a float64 reference of each form (rows, columns, depth, batched),
the gradients included, and against torch._grouped_mm where torch takes the call. GPU tests."""
import pytest

torch = pytest.importorskip("torch")
tessera = pytest.importorskip("tessera")

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def ends_of(sizes):
    return torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()


def clamped(offs, extent):
    """The groups' [begin, end) as grouped_mm reads them: each end at least the one before it,
    at most the extent."""
    out, prev = [], 0
    for e in offs.tolist():
        end = min(max(e, prev), extent)
        out.append((prev, end))
        prev = end
    return out


def reference(a, b, offs):
    """float64, group by group; rows (columns) past the last end zero."""
    a, b = a.double(), b.double()
    if a.dim() == 3 and b.dim() == 3:
        return a @ b
    if a.dim() == 2 and b.dim() == 3:  # rows
        out = a.new_zeros(a.shape[0], b.shape[-1])
        for g, (lo, hi) in enumerate(clamped(offs, a.shape[0])):
            out[lo:hi] = a[lo:hi] @ b[g]
        return out
    if a.dim() == 3:  # columns
        out = a.new_zeros(a.shape[1], b.shape[-1])
        for g, (lo, hi) in enumerate(clamped(offs, b.shape[-1])):
            out[:, lo:hi] = a[g] @ b[:, lo:hi]
        return out
    out = a.new_zeros(offs.numel(), a.shape[0], b.shape[-1])  # depth
    for g, (lo, hi) in enumerate(clamped(offs, a.shape[1])):
        out[g] = a[:, lo:hi] @ b[lo:hi]
    return out


def close(got, want, dtype, k):
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    scale = want.abs().max().item() or 1.0
    err = (got.double() - want).abs().max().item() / scale
    assert err <= tol * (1 + k ** 0.5 / 8), (err, tol)


DTYPES = [torch.bfloat16, torch.float16, torch.float32]

# (M, K, N, group sizes): sm90-sized (16-byte rows), odd, empty groups first and last, one-row
# groups, a tail of rows past the last end, one group
ROWS = [(1000, 128, 256, [0, 1, 300, 7, 129, 0, 64, 499]),
        (777, 100, 72, [5, 0, 700, 1, 1]),
        (640, 256, 128, [640]),
        (300, 64, 136, [0, 100, 100, 0]),       # rows 200..299 past the last end: zero
        (2051, 512, 384, [17] * 64 + [963])]


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n,sizes", ROWS)
@pytest.mark.parametrize("b_kmajor", [False, True])
def test_rows_form_and_its_gradients(dtype, m, k, n, sizes, b_kmajor):
    g = len(sizes)
    a = torch.randn(m, k, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(g, n, k, device="cuda", dtype=dtype) if b_kmajor else torch.randn(g, k, n, device="cuda", dtype=dtype)
    b = (w.transpose(-2, -1) if b_kmajor else w).detach().requires_grad_(True)
    offs = ends_of(sizes)
    out = tessera.grouped_mm(a, b, offs)
    close(out, reference(a.detach(), b.detach(), offs), dtype, k)
    dy = torch.randn_like(out)
    out.backward(dy)
    a64, b64 = a.detach().double().requires_grad_(True), b.detach().double().requires_grad_(True)
    reference(a64, b64, offs).backward(dy.double())
    close(a.grad, a64.grad, dtype, n)
    close(b.grad, b64.grad, dtype, m)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_columns_depth_and_batched_forms(dtype):
    def x(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True)
    for a, b, offs in [(x(3, 40, 64), x(64, 100), ends_of([30, 0, 60])),     # columns, 10 past the end
                       (x(48, 200), x(200, 72), ends_of([0, 17, 150, 33])),  # depth, an empty group
                       (x(4, 33, 64), x(4, 64, 48), None)]:                  # batched
        out = tessera.grouped_mm(a, b, offs)
        close(out, reference(a.detach(), b.detach(), offs), dtype, a.shape[-1])
        dy = torch.randn_like(out)
        out.backward(dy)
        a64, b64 = a.detach().double().requires_grad_(True), b.detach().double().requires_grad_(True)
        reference(a64, b64, offs).backward(dy.double())
        close(a.grad, a64.grad, dtype, out.shape[-1])
        close(b.grad, b64.grad, dtype, a.shape[-2])


@gpu
def test_bad_offsets_are_clamped_never_read_out_of_bounds():
    a = torch.randn(100, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(3, 64, 32, device="cuda", dtype=torch.bfloat16)
    offs = torch.tensor([60, 20, 500], device="cuda", dtype=torch.int32)  # decreasing, then past M
    out = tessera.grouped_mm(a, b, offs)
    close(out, reference(a, b, offs), torch.bfloat16, 64)


@gpu
def test_out_dtype_float32():
    a = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4, 128, 64, device="cuda", dtype=torch.bfloat16)
    out = tessera.grouped_mm(a, b, ends_of([64, 64, 64, 64]), out_dtype=torch.float32)
    assert out.dtype == torch.float32
    close(out, reference(a, b, ends_of([64, 64, 64, 64])), torch.float32, 8 * 128)


@gpu
def test_matches_torch_grouped_mm():
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch has no _grouped_mm")
    a = torch.randn(4096, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(16, 256, 512, device="cuda", dtype=torch.bfloat16)
    offs = ends_of([256] * 8 + [0, 512, 1, 255, 256, 512, 512, 0])  # all 4096 rows: torch leaves a tail unset
    want = torch._grouped_mm(a, w.transpose(-2, -1), offs)
    got = tessera.grouped_mm(a, w.transpose(-2, -1), offs)
    close(got, want.double(), torch.bfloat16, 512)


@gpu
def test_errors_name_the_argument():
    a = torch.randn(64, 32, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2, 32, 16, device="cuda", dtype=torch.bfloat16)
    offs = ends_of([32, 32])
    with pytest.raises(ValueError, match="argument 'offs'"):
        tessera.grouped_mm(a, b, None)
    with pytest.raises(ValueError, match="argument 'offs'"):
        tessera.grouped_mm(a, b, ends_of([64]))
    with pytest.raises(TypeError, match="argument 'offs'"):
        tessera.grouped_mm(a, b, offs.long())
    with pytest.raises(ValueError, match="argument 'other'"):
        tessera.grouped_mm(a, torch.randn(2, 31, 16, device="cuda", dtype=torch.bfloat16), offs)
    with pytest.raises(TypeError, match="argument 'mat_b'"):
        tessera.grouped_mm(a, b.half(), offs)


def test_cpu_tensors_go_to_torch():
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch has no _grouped_mm")
    a = torch.randn(24, 16, dtype=torch.bfloat16)
    b = torch.randn(3, 16, 8, dtype=torch.bfloat16)
    offs = torch.tensor([8, 8, 24], dtype=torch.int32)
    try:
        want = torch._grouped_mm(a, b, offs)
    except (RuntimeError, NotImplementedError) as e:  # torch's CPU kernel refusing: its error again
        with pytest.raises(type(e)):
            tessera.grouped_mm(a, b, offs)
        return
    assert torch.equal(tessera.grouped_mm(a, b, offs), want)
