"""The upload kernel (engine_plugin/upload_triton.py) against its reference: spans shorter and
longer than a program's block, one empty, into two destinations, and a token map expanded from a
batch's state rows (entries of one token and of more than a block, one of none, a tail to null).
On the CPU in Triton's interpreter (one flat array standing for the address space), on the GPU
from a pinned ring buffer into device tensors, launched either way (the routing's GPU tests check
the uploads end to end)."""

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


# a batch by state rows: [n] state of each entry, [n+1] where its tokens start; rows per state; the
# token map's last length (its tail past this batch's tokens is nulled)
STATES = [3, 0, 5, 1]
STARTS = [0, 1, 1, 1 + 2500, 2500 + 4]                 # 1 token, none, 2500 (> a block), 3
ROWS = [7, 0, 9, 4, 0, 2]
STALE = 2500 + 40


def _batch() -> np.ndarray:
    """The batch's words, laid out as in memory: states, starts, rows, then the token map [STALE]
    holding a stale map (-1)."""
    return np.concatenate([np.array(STATES + STARTS + ROWS, np.int32), np.full(STALE, -1, np.int32)])


def _expected_map() -> list[int]:
    tok = []
    for i, state in enumerate(STATES):
        tok += [ROWS[state]] * (STARTS[i + 1] - STARTS[i])
    return tok + [0] * (STALE - len(tok))


_INTERPRETED = """
import sys
sys.path.insert(0, {tests!r})
import numpy as np
from hotwire.engine_plugin import upload_triton
from test_upload_kernel import STALE, STARTS, STATES, ROWS, _batch, _expected_map, _spans

words = 3 * upload_triton.BLOCK
memory = np.concatenate([np.arange(1, words + 1, dtype=np.int32), np.zeros(words, np.int32),
                         np.full(64, -1, np.int32), _batch()])             # host words, a, b, the batch
at = {{"a": words, "b": 2 * words}}
states = 2 * words + 64
starts, rows = states + len(STATES), states + len(STATES) + len(STARTS)
tok = rows + len(ROWS)
segments = [(at[d] + to, start, stop - start) for start, stop, d, to in _spans(words)]
header = [len(segments), states, starts, rows, tok, len(STATES), STARTS[-1], STALE]
want = memory.copy()
upload_triton.reference(want, np.array(header + [w for s in segments for w in s], dtype=np.int64))
assert want[tok: tok + STALE].tolist() == _expected_map()
base = memory.ctypes.data
address = [len(segments)] + [base + 4 * w for w in header[1:5]] + header[5:]
desc = np.array(address + [w for dst, src, n in segments for w in (base + 4 * dst, base + 4 * src, n)], dtype=np.int64)
upload_triton.launch(desc.ctypes.data, len(segments) + len(STATES) + 1)
assert (memory == want).all() and (want[words: 2 * words] != 0).sum() > 2500
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
desc = np.array([1] + [0] * (upload_triton.HEADER - 1) + [base + 400, base, 100], dtype=np.int64)  # memory[100:200] = memory[0:100]
empty = np.zeros(upload_triton.HEADER + 3, dtype=np.int64)
launch = upload_triton.launcher(empty.ctypes.data, 0)  # compiled by one launch of an empty header
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
def test_the_upload_kernel_moves_each_span_and_expands_the_map_as_its_reference_does_on_the_gpu(by, monkeypatch):
    """Launched by the driver (engine_plugin/driver_launch.py), and by Triton where that cannot be."""
    from hotwire.engine_plugin import driver_launch, upload_triton
    from hotwire.engine_plugin.staging import DeviceWords, Expansion, HostRing

    if by == "Triton":
        monkeypatch.setattr(driver_launch, "_driver", lambda: None)
    words = 3 * upload_triton.BLOCK
    ring = HostRing(words + len(ROWS), depth=2, device=torch.device("cuda"), spans=4)
    assert ring.how == f"the upload kernel, launched by {by}" and ring.expands
    a, b = torch.zeros(words, dtype=torch.int32, device="cuda"), torch.full((64,), -1, dtype=torch.int32, device="cuda")
    states, starts = (torch.tensor(v, dtype=torch.int32, device="cuda") for v in (STATES, STARTS))
    tok = torch.full((STALE,), -1, dtype=torch.int32, device="cuda")
    buf = ring.next()
    buf[:words] = np.arange(1, words + 1, dtype=np.int32)
    buf[words:] = ROWS
    dst = {"a": DeviceWords(a), "b": DeviceWords(b)}
    ring.copy([(start, stop, dst[d], to) for start, stop, d, to in _spans(words)],
              Expansion(states.data_ptr(), starts.data_ptr(), words, DeviceWords(tok), len(STATES), STARTS[-1], STALE))
    memory = np.concatenate([buf[:words], np.zeros(words, np.int32), np.full(64, -1, np.int32)])  # host words, a, b
    at = {"a": words, "b": 2 * words}
    segments = [(at[d] + to, start, stop - start) for start, stop, d, to in _spans(words)]
    upload_triton.reference(memory, np.array([len(segments)] + [0] * 7 + [w for s in segments for w in s]))
    torch.cuda.synchronize()
    assert a.tolist() == memory[words: 2 * words].tolist() and b.tolist() == memory[2 * words:].tolist()
    assert tok.tolist() == _expected_map()
