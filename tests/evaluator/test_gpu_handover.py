"""What of the GPU hand-over of output sets runs without a GPU: a set with no cuda-python goes
through its file; the checker's side says a wrong shape or dtype, or bytes that do not match
them, by name before it copies anything (tests/gpu/test_cuda_language.py runs the copies)."""

from __future__ import annotations

import pytest
import torch

from services.evaluator.harness import gpu_handover, timing
from services.evaluator.harness.correctness import Check
from shared.schema import Status


def test_without_cuda_python_a_set_goes_through_its_file(monkeypatch):
    monkeypatch.setattr(timing, "_CUDA", [None])
    assert gpu_handover.export_set({"y": torch.ones(2)}, torch.device("cpu")) is None


def _described(shape, dtype="float32", nbytes=None):
    known = getattr(torch, dtype, None)
    size = torch.empty(shape, dtype=known, device="meta").nbytes if isinstance(known, torch.dtype) else 0
    return {"tensors": {"y": {"dtype": dtype, "shape": shape, "nbytes": size if nbytes is None else nbytes,
                              "handle": "00" * 64, "offset": 0}}, "scalars": {"n": 3}}


@pytest.mark.parametrize(("descriptor", "status", "words"), [
    (_described([4, 5]), Status.INCORRECT_SHAPE, "shape"),
    (_described([4, 4], "float64"), Status.INCORRECT_DTYPE, "dtype"),
    (_described([4, 4], "no_such_type"), Status.INCORRECT_DTYPE, "unknown dtype"),
    (_described([4, 4], nbytes=8), Status.REWARD_HACK, "do not match"),
], ids=["shape", "dtype", "unknown_dtype", "bytes"])
def test_the_checker_refuses_a_set_by_its_descriptor_first(monkeypatch, descriptor, status, words):
    monkeypatch.setattr(timing, "_CUDA", [None])  # nothing may be opened or copied here
    importer = gpu_handover.Importer(torch.device("cpu"))
    got = importer.load(descriptor, {"y": torch.zeros(4, 4)})
    assert isinstance(got, Check) and got.status is status and words in got.message, got


def test_empty_tensors_and_scalars_need_no_copy(monkeypatch):
    monkeypatch.setattr(timing, "_CUDA", [None])
    importer = gpu_handover.Importer(torch.device("cpu"))
    got = importer.load(_described([0, 4]), {"y": torch.zeros(0, 4)})
    assert got["n"] == 3 and got["y"].shape == (0, 4)
    importer.close()
