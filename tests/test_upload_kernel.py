"""The upload kernel (engine_plugin/upload_triton.py) against its reference: spans shorter and
longer than a program's block, one empty, into two destinations. On the CPU in Triton's
interpreter (one flat array standing for the address space), on the GPU from a pinned ring buffer
into device tensors, launched either way (the routing's GPU tests check the uploads end to end)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

# (src start, src stop, destination, word in it): destinations never overlap (programs run in any order)
def _spans(words: int) -> list[tuple[int, int, str, int]]:
    return [(5, 5 + 2500, "a", 7), (0, 3, "b", 60), (9, 9, "b", 0), (words - 10, words, "a", 3000)]


_INTERPRETED = """
import sys
sys.path.insert(0, {tests!r})
import numpy as np
from hotwire.engine_plugin import upload_triton
from test_upload_kernel import _spans

words = 3 * upload_triton.BLOCK
memory = np.concatenate([np.arange(1, words + 1, dtype=np.int32), np.zeros(words, np.int32),
                         np.full(64, -1, np.int32)])                      # host words, a, b
at = {{"a": words, "b": 2 * words}}
offsets = np.array([(at[d] + to, start, stop - start) for start, stop, d, to in _spans(words)], dtype=np.int64)
want = memory.copy()
upload_triton.reference(want, offsets)
base = memory.ctypes.data
desc = np.array([(base + 4 * dst, base + 4 * src, n) for dst, src, n in offsets.tolist()], dtype=np.int64)
upload_triton.launch(desc.ctypes.data, len(desc))
assert (memory == want).all() and (want[words:] != 0).sum() > 2500
print("upload ok")
"""


_REFUSED_BY_THE_DRIVER = """
import sys
sys.path.insert(0, {tests!r})
import numpy as np
from refused_launch import refuse_every_launch
from hotwire.engine_plugin import upload_triton

tries = refuse_every_launch()
memory = np.concatenate([np.arange(1, 101, dtype=np.int32), np.zeros(100, np.int32)])
base = memory.ctypes.data
desc = np.array([(base + 400, base, 100)], dtype=np.int64)  # memory[100:200] = memory[0:100]
empty = np.zeros((1, 3), dtype=np.int64)
launch = upload_triton.launcher(empty.ctypes.data, 0)  # compiled by one launch of an empty span
for _ in range(2):  # the driver's, refused, then Triton's; Triton's
    memory[100:] = 0
    launch(desc.ctypes.data, 1)
    assert (memory[100:] == memory[:100]).all()
assert tries == [1], tries  # the driver was asked once
print("fallback ok")
"""


def test_an_upload_the_driver_refuses_falls_back_to_triton_for_good():
    """A driver error on the upload kernel's launch must not take the engine down: the upload is
    made by Triton, and so is every later one (the driver is not asked again; Triton's
    interpreter stands in for the GPU)."""
    pytest.importorskip("triton")
    run = subprocess.run([sys.executable, "-c", _REFUSED_BY_THE_DRIVER.format(tests=str(Path(__file__).parent))],
                         env={**__import__("os").environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0 and "fallback ok" in run.stdout, run.stderr[-3000:]


def test_the_upload_kernel_moves_each_span_as_its_reference_does_in_the_interpreter():
    pytest.importorskip("triton")
    run = subprocess.run([sys.executable, "-c", _INTERPRETED.format(tests=str(Path(__file__).parent))],
                         env={**__import__("os").environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0 and "upload ok" in run.stdout, run.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("by", ["the driver", "Triton"])
def test_the_upload_kernel_moves_each_span_as_its_reference_does_on_the_gpu(by, monkeypatch):
    """Launched by the driver (engine_plugin/driver_launch.py), and by Triton where that cannot be."""
    from hotwire.engine_plugin import driver_launch, upload_triton
    from hotwire.engine_plugin.staging import DeviceWords, HostRing

    if by == "Triton":
        monkeypatch.setattr(driver_launch, "_driver", lambda: None)
    words = 3 * upload_triton.BLOCK
    ring = HostRing(words, depth=2, device=torch.device("cuda"), spans=4)
    assert ring.how == f"the upload kernel, launched by {by}"
    a, b = torch.zeros(words, dtype=torch.int32, device="cuda"), torch.full((64,), -1, dtype=torch.int32, device="cuda")
    buf = ring.next()
    buf[:] = np.arange(1, words + 1, dtype=np.int32)
    dst = {"a": DeviceWords(a), "b": DeviceWords(b)}
    ring.copy([(start, stop, dst[d], to) for start, stop, d, to in _spans(words)])
    memory = np.concatenate([buf, np.zeros(words, np.int32), np.full(64, -1, np.int32)])  # host words, a, b
    at = {"a": words, "b": 2 * words}
    upload_triton.reference(memory, np.array([(at[d] + to, start, stop - start)
                                              for start, stop, d, to in _spans(words)]))
    torch.cuda.synchronize()
    assert a.tolist() == memory[words: 2 * words].tolist() and b.tolist() == memory[2 * words:].tolist()
