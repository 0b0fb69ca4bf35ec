"""Legitimate solutions the guards must leave alone: each is a correct way to write y = x * w + b
(fast, in place into the output, through helpers, numpy, loops, out= variants, temporaries, views,
worker threads and processes that finish inside the call...), and each must PASS. A guard that
flags one of them is a false positive.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shared.schema import Status
from tests.hacks.hackkit import Attempts, Case, assert_status, start_attempts

OK = Status.PASSED
RETURNS = {"dps": False}

CASES = [
    Case("copy_into_output", OK, """
        def run(x, w, b, y):
            y.copy_(x * w + b)
        """),
    Case("addcmul_out", OK, """
        import torch

        def run(x, w, b, y):
            torch.addcmul(b, x, w, out=y)
        """),
    Case("mul_out_then_add_in_place", OK, """
        import torch

        def run(x, w, b, y):
            torch.mul(x, w, out=y).add_(b)
        """),
    Case("in_place_steps_on_the_output", OK, """
        def run(x, w, b, y):
            y.copy_(x)
            y.mul_(w)
            y.add_(b)
        """),
    Case("bias_first_then_addcmul_", OK, """
        def run(x, w, b, y):
            y.copy_(b.expand_as(y)).addcmul_(x, w)
        """),
    Case("slice_assignment", OK, """
        def run(x, w, b, y):
            y[...] = x * w + b
        """),
    Case("returns_a_new_tensor", OK, """
        import torch

        def run(x, w, b):
            return torch.addcmul(b, x, w)
        """, solution=RETURNS),
    Case("returns_a_dict", OK, """
        def run(x, w, b):
            return {"y": x * w + b}
        """, solution=RETURNS),
    Case("returns_a_one_tuple", OK, """
        def run(x, w, b):
            return (x * w + b,)
        """, solution=RETURNS),
    Case("returns_a_one_list", OK, """
        def run(x, w, b):
            return [x.mul(w).add(b)]
        """, solution=RETURNS),
    Case("returns_a_strided_view", OK, """
        import torch

        def run(x, w, b):
            wide = torch.empty(x.shape[0], 2 * x.shape[1], dtype=x.dtype)
            wide[:, ::2] = x * w + b
            return wide[:, ::2]  # every other column of a wider buffer: not contiguous
        """, solution=RETURNS),
    Case("returns_a_transposed_view", OK, """
        def run(x, w, b):
            return (x.t() * w[:, None] + b[:, None]).t()
        """, solution=RETURNS),
    Case("numpy_out", OK, """
        import numpy as np

        def run(x, w, b, y):
            out = y.numpy()
            np.multiply(x.numpy(), w.numpy(), out=out)
            np.add(out, b.numpy(), out=out)
        """),
    Case("numpy_round_trip", OK, """
        import torch

        def run(x, w, b):
            return torch.from_numpy(x.numpy() * w.numpy() + b.numpy())
        """, solution=RETURNS),
    Case("row_loop", OK, """
        def run(x, w, b, y):
            for i in range(x.shape[0]):
                y[i] = x[i] * w + b
        """),
    Case("chunked_rows", OK, """
        def run(x, w, b, y):
            for xs, ys in zip(x.split(2), y.split(2)):
                ys.copy_(xs * w + b)
        """),
    Case("element_loop", OK, """
        def run(x, w, b, y):
            rows, cols = x.shape
            xl, wl, bl = x.tolist(), w.tolist(), b.tolist()
            for i in range(rows):
                for j in range(cols):
                    y[i, j] = xl[i][j] * wl[j] + bl[j]
        """),
    Case("stack_of_rows", OK, """
        import torch

        def run(x, w, b):
            return torch.stack([row * w + b for row in x.unbind(0)])
        """, solution=RETURNS),
    Case("einsum", OK, """
        import torch

        def run(x, w, b, y):
            y.copy_(torch.einsum("nd,d->nd", x, w) + b)
        """),
    Case("diagonal_matmul", OK, """
        import torch

        def run(x, w, b, y):
            torch.addmm(b.expand_as(y), x, torch.diag(w), out=y)
        """),
    Case("functional_linear", OK, """
        import torch.nn.functional as F
        import torch

        def run(x, w, b):
            return F.linear(x, torch.diag(w), b)
        """, solution=RETURNS),
    Case("float64_then_back", OK, """
        def run(x, w, b, y):
            y.copy_((x.double() * w.double() + b.double()).to(y.dtype))
        """),
    Case("helper_class_instance", OK, """
        import torch

        class Affine:
            def __init__(self):
                self.calls = 0

            def __call__(self, x, w, b, y):
                self.calls += 1
                torch.addcmul(b, x, w, out=y)

        run = Affine()
        """),
    Case("helper_module", OK, """
        from kernels import affine_into

        def run(x, w, b, y):
            affine_into(x, w, b, y)
        """, solution={"extra_sources": {"kernels.py": (
            "import torch\n\n\ndef affine_into(x, w, b, y):\n    torch.mul(x, w, out=y)\n    y.add_(b)\n")}}),
    # A workspace reused across calls (its contents are rewritten every call): not a result cache.
    Case("reused_workspace", OK, """
        import torch

        WORKSPACE = {}

        def run(x, w, b, y):
            scratch = WORKSPACE.get(x.shape)
            if scratch is None:
                scratch = WORKSPACE[x.shape] = torch.empty_like(x)
            torch.mul(x, w, out=scratch)
            torch.add(scratch, b, out=y)
        """),
    Case("temporaries_fully_overwritten", OK, """
        import torch

        def run(x, w, b, y):
            product = torch.empty_like(x)
            product.copy_(x)
            product *= w
            total = torch.empty_like(x)
            torch.add(product, b, out=total)
            y.copy_(total)
        """),
    Case("cached_shape_plan", OK, """
        import functools

        @functools.lru_cache(maxsize=None)
        def _plan(rows, cols):
            return max(1, rows // 2), cols  # a block size per shape: depends on shapes only

        def run(x, w, b, y):
            block, _ = _plan(*x.shape)
            for start in range(0, x.shape[0], block):
                y[start:start + block] = x[start:start + block] * w + b
        """),
    Case("threads_joined_inside_the_call", OK, """
        import threading

        def run(x, w, b, y):
            half = x.shape[0] // 2
            def part(lo, hi):
                y[lo:hi] = x[lo:hi] * w + b
            workers = [threading.Thread(target=part, args=(0, half)),
                       threading.Thread(target=part, args=(half, x.shape[0]))]
            for t in workers:
                t.start()
            for t in workers:
                t.join()
        """),
    Case("thread_pool_shut_down_inside_the_call", OK, """
        from concurrent.futures import ThreadPoolExecutor

        def run(x, w, b, y):
            with ThreadPoolExecutor(max_workers=2) as pool:
                list(pool.map(lambda i: y[i].copy_(x[i] * w + b), range(x.shape[0])))
        """),
    Case("global_torch_settings_at_import", OK, """
        import torch

        torch.manual_seed(0)  # its own random numbers: the inputs do not come from them
        torch.set_num_threads(1)
        NOISE = torch.rand(4)

        def run(x, w, b, y):
            with torch.inference_mode():
                y.copy_(torch.addcmul(b, x, w))
        """),
    Case("scratch_file_in_its_home", OK, """
        import os
        import tempfile

        def run(x, w, b, y):
            with tempfile.NamedTemporaryFile(dir=os.environ["HOME"], suffix=".log") as log:
                log.write(b"called\\n")
            y.copy_(x * w + b)
        """),
    Case("prints_while_working", OK, """
        def run(x, w, b, y):
            print("affine", tuple(x.shape), flush=True)
            y.copy_(x * w + b)
        """),
    Case("collects_garbage", OK, """
        import gc

        def run(x, w, b, y):
            gc.collect()
            y.copy_(x * w + b)
        """),
    Case("writes_through_ctypes", OK, """
        import ctypes

        def run(x, w, b, y):
            result = (x * w + b).contiguous()
            ctypes.memmove(y.data_ptr(), result.data_ptr(), result.numel() * result.element_size())
        """),
    # A library that installs its crash handlers lazily, inside an honest first call (Triton's LLVM
    # does so for SIGHUP, SIGUSR1/2, SIGTERM, ... on its first compile: an H100 run of 2026-12-05
    # called an honest Triton solution REWARD_HACK for it). faulthandler is such a library here: its
    # native handlers (SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL) live in the interpreter.
    Case("a_library_installs_crash_handlers_in_the_call", OK, """
        import faulthandler

        def run(x, w, b, y):
            if not faulthandler.is_enabled():
                faulthandler.enable()
            y.copy_(x * w + b)
        """),
    # Ignoring a signal runs no code (the same LLVM sets SIGXFSZ to be ignored).
    Case("ignores_a_signal_in_the_call", OK, """
        import ctypes
        import signal

        def run(x, w, b, y):
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            ctypes.CDLL(None).signal(signal.SIGUSR2, ctypes.c_void_p(1))  # SIG_IGN, natively
            y.copy_(x * w + b)
        """),
    Case("bfloat16_in_float32", OK, """
        def run(x, w, b, y):
            y.copy_((x.float() * w.float() + b.float()).to(y.dtype))
        """, problem="affine_bfloat16"),
    Case("bfloat16_addcmul", OK, """
        import torch

        def run(x, w, b):
            return torch.addcmul(b, x, w)
        """, problem="affine_bfloat16", solution=RETURNS),
    Case("tunable_block", OK, """
        def run(x, w, b, y):
            for start in range(0, x.shape[0], BLOCK):
                y[start:start + BLOCK] = x[start:start + BLOCK] * w + b
        """, solution={"tunables": {"BLOCK": [1, 4]}, "tunable_values": {"BLOCK": 4}}),
]


@pytest.fixture(scope="module")
def attempts(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Attempts]:
    yield from start_attempts(request, tmp_path_factory.mktemp("legitimate"), CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_legitimate_solution_passes(attempts: Attempts, case: Case) -> None:
    assert_status(attempts[case], case)
    result = attempts[case].result
    assert result.latency_ms is not None and result.latency_ms > 0


def test_there_are_at_least_thirty() -> None:
    assert len({c.id for c in CASES}) == len(CASES) >= 30
