"""Language `cute_dsl` without a GPU: UNSUPPORTED with a clear message where the DSL is missing, and
the child's wrapper (one `cute.compile` per signature, compile time kept, COMPILE_ERROR on refusal)
driven through a stand-in for `cutlass.cute`. The real DSL runs in tests/gpu/test_cute_dsl.py."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from services.evaluator.languages import cutedsl
from services.evaluator.languages.build import build_solution
from shared.schema import Solution, Status

KERNEL = "import cutlass.cute as cute\n\n@cute.jit\ndef run(x: cute.Tensor, y: cute.Tensor):\n    pass\n"


def cute_solution() -> Solution:
    return Solution.model_validate({
        "name": "scale_cute", "definition": "scale", "author": "tests",
        "spec": {"languages": ["cute_dsl"], "target_hardware": ["H200"], "entry_point": "kernel.py::run"},
        "sources": [{"path": "kernel.py", "content": KERNEL}]})


def test_without_the_dsl_the_attempt_is_unsupported_and_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(cutedsl, "available", lambda: False)
    build = build_solution(cute_solution(), "cuda", tmp_path / "solution")
    assert build.status is Status.UNSUPPORTED and "install nvidia-cutlass-dsl" in build.log
    monkeypatch.setattr(cutedsl, "available", lambda: True)
    assert build_solution(cute_solution(), "cuda", tmp_path / "solution2").status is None
    assert build_solution(cute_solution(), "cpu", tmp_path / "solution3").status is Status.UNSUPPORTED


class StandInCute:
    """`cutlass.cute` as far as the wrapper uses it: `compile` returns a callable, or raises."""

    def __init__(self) -> None:
        self.compiles: list[tuple] = []
        self.refuse = False

    def compile(self, function, *views):
        self.compiles.append(tuple(type(v).__name__ for v in views))
        if self.refuse:
            raise ValueError("\x1b[91merror[ARG_ANNOTATION_MISMATCH]:\x1b[0m expects argument #2 (y) to be a Tensor")
        return lambda *args: ("ran", function.__name__, len(args))


@pytest.fixture
def cute(monkeypatch) -> StandInCute:
    stand_in = StandInCute()
    package, runtime = types.ModuleType("cutlass"), types.ModuleType("cutlass.cute.runtime")
    module = types.ModuleType("cutlass.cute")
    module.compile = stand_in.compile
    runtime.from_dlpack = lambda tensor: ("view", tuple(tensor.shape))
    monkeypatch.setitem(sys.modules, "cutlass", package)
    monkeypatch.setitem(sys.modules, "cutlass.cute", module)
    monkeypatch.setitem(sys.modules, "cutlass.cute.runtime", runtime)
    package.cute, module.runtime = module, runtime
    return stand_in


def scale(x, y):
    pass


def test_each_signature_is_compiled_once_and_its_time_kept(cute):
    entry = cutedsl.CuteEntry(scale)
    small, large = torch.ones(8), torch.ones(16)
    assert entry(small, torch.empty(8)) == ("ran", "scale", 2)
    entry(torch.ones(8), torch.empty(8))  # new addresses, same signature: no compile
    entry(large, torch.empty(16))
    entry(small.view(2, 4).t(), torch.empty(4, 2))  # other strides
    entry(torch.ones(8, dtype=torch.float16), torch.empty(8, dtype=torch.float16))
    assert len(cute.compiles) == 4 and entry.compile_s > 0.0
    assert cute.compiles[0] == ("tuple", "tuple")  # tensors go as DLPack views


def test_a_refused_compile_is_a_compile_error_with_a_plain_message(cute):
    cute.refuse = True
    entry = cutedsl.CuteEntry(scale)
    with pytest.raises(cutedsl.CompileFailed) as refused:
        entry(torch.ones(8), 3.5)
    assert str(refused.value).startswith("ValueError: error[ARG_ANNOTATION_MISMATCH]: expects argument #2")
    assert "\x1b" not in str(refused.value)


def test_the_signature_covers_shape_strides_dtype_device_and_scalar_types():
    x = torch.ones(2, 3)
    assert cutedsl.signature((x, 1.5, 2)) == (((2, 3), (3, 1), "torch.float32", "cpu"), "float", "int")
    assert cutedsl.signature((x.t(),)) != cutedsl.signature((x.t().contiguous(),))
