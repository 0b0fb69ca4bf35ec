"""`tensorfile.save` with tensors on the GPU: their bytes go through the pinned staging buffer in
chunks, and the file is byte for byte the one their CPU copies make. Run on the GPU machine:
`pytest -m gpu tests/gpu`.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from services.evaluator.harness import tensorfile  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_stage(monkeypatch):
    monkeypatch.setattr(tensorfile, "_STAGING", {})


def test_a_gpu_set_writes_the_file_its_cpu_copy_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(tensorfile, "STAGE_BYTES", 4096)  # several chunks for the larger tensors
    base = torch.randn(300, 7, device="cuda")
    values = {"base": base, "t": base.t(), "tail": base[100:], "alias": base, "k": 2, "nothing": None,
              "bf16": torch.randn(5000, device="cuda").to(torch.bfloat16), "empty": torch.empty(0, 4, device="cuda"),
              "one": torch.tensor(3, device="cuda"), "host": torch.arange(10), "mask": base > 0}
    tensorfile.save(values, tmp_path / "gpu.st")
    assert tensorfile._STAGING["buffer"].is_pinned() and tensorfile._STAGING["buffer"].numel() == 4096
    on_host = {n: v.cpu() if isinstance(v, torch.Tensor) else v for n, v in values.items()}
    tensorfile.save(on_host, tmp_path / "cpu.st")
    assert (tmp_path / "gpu.st").read_bytes() == (tmp_path / "cpu.st").read_bytes()
    loaded = tensorfile.load(tmp_path / "gpu.st", "cuda")
    for name, value in on_host.items():
        if isinstance(value, torch.Tensor):
            back = loaded[name].cpu()
            assert back.dtype == value.dtype and back.shape == value.shape
            assert torch.equal(back.contiguous().reshape(-1).view(torch.uint8),
                               value.contiguous().reshape(-1).view(torch.uint8)), name
