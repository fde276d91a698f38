"""README.md's Python snippets run as written: every ```python block, in order, in one namespace
(a GPU test). On any machine: the blocks are found and are valid Python. The C++ block is
compiled and run by tests/cpp/readme_test.cpp."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"

_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """The ```python fenced blocks of a markdown text, in order: (line of the block's first code
    line, 1-based; its code)."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in _BLOCK.finditer(text)]


def readme_blocks() -> list[tuple[int, str]]:
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert blocks, f"{README} has no ```python block"
    return blocks


def compiled(line: int, code: str):
    # Padded so that a traceback's line numbers are README.md's.
    return compile("\n" * (line - 1) + code, str(README), "exec")


def test_extraction_finds_python_blocks_only():
    text = ("# t\n\n```python\na = 1\n```\n\n    b = 2  # indented: not a block\n\n```cpp\nint c;\n```\n"
            "```pythonx\nd = 3\n```\n```python\ne = a + 1\nf = e\n```\n")
    blocks = python_blocks(text)
    assert blocks == [(4, "a = 1\n"), (16, "e = a + 1\nf = e\n")]
    assert text.splitlines()[3] == "a = 1" and text.splitlines()[15] == "e = a + 1"


def test_readme_blocks_are_python():
    for line, code in readme_blocks():
        compiled(line, code)  # a SyntaxError names README.md and its line


@pytest.mark.gpu
def test_readme_python_blocks_run():
    blocks = readme_blocks()
    torch = pytest.importorskip("torch", reason="README's snippets need PyTorch, not installed")
    if not torch.cuda.is_available():
        pytest.skip("README's snippets need a CUDA GPU: torch sees none")
    import tessera
    if not tessera.is_available():
        pytest.skip(f"needs a CUDA GPU: {tessera.no_gpu_reason() or 'none usable'}")
    from tessera import _torch
    if _torch.ops is None:
        pytest.skip("the wheel was built without torch (an isolated build): no torch ops, which "
                    "README's snippets use (autograd, attention, the losses, tessera.enable)")
    namespace = {"__name__": "__readme__"}
    try:
        for line, code in blocks:
            exec(compiled(line, code), namespace)
        torch.cuda.synchronize()
    finally:
        tessera.disable()  # whatever a failing block left routed
