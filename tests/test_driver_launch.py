"""The driver's launch of a compiled kernel (engine_plugin/driver_launch.py), on the CPU against a
stand-in for the CUDA driver that reads each parameter as the real one does (its size in bytes
from where the launch's pointer says): what a kernel reads is what the caller passed, int32
parameters included, and a kernel whose parameters are not the sizes asked for keeps Triton's
launch. The GPU tests launch the real kernels this way (test_steering_op.py, test_upload_kernel.py)."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import pytest
import torch

from hotwire.engine_plugin import driver_launch
from hotwire.engine_plugin.driver_launch import HALF, WORD

SCRATCH = (WORD, WORD)  # the two scratch pointers Triton adds to every kernel


class Driver:
    """``cuFuncGetParamInfo`` answering ``sizes``; ``cuLaunchKernel`` recording the grid, the
    block and each parameter's value as the driver would read it."""

    def __init__(self, sizes: tuple[int, ...], rc: int = 0):
        self.sizes, self.launches, self.rc = sizes, [], rc

    def cuFuncGetParamInfo(self, function, index, offset, size):
        if index >= len(self.sizes):
            return 1  # CUDA_ERROR_INVALID_VALUE: past the last parameter
        size._obj.value = self.sizes[index]
        return 0

    def cuLaunchKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        at = (ctypes.c_void_p * len(self.sizes)).from_address(params)
        values = [int.from_bytes(ctypes.string_at(at[i], n), "little") for i, n in enumerate(self.sizes)]
        self.launches.append(dict(grid=(gx, gy, gz), block=(bx, by, bz), shared=shared, values=values))
        return self.rc

    def cuGetErrorName(self, rc, name):
        name._obj.value = b"CUDA_ERROR_INVALID_VALUE" if rc == 1 else None
        return 0


def _compiled(num_warps=4, **meta):
    return SimpleNamespace(function=0xC0DE, name="kernel", metadata=SimpleNamespace(num_warps=num_warps, shared=64,
                                                                                   **meta))


def _launcher(monkeypatch, sizes, words, compiled=None, rc=0):
    driver = Driver(sizes, rc)
    monkeypatch.setattr(driver_launch, "_driver", lambda: driver)
    # torch's current stream, which a CPU build lacks; the stand-in ignores it
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0, raising=False)
    return driver, driver_launch.launcher(compiled or _compiled(), words, 0)


def test_a_kernel_reads_each_word_at_its_size(monkeypatch):
    words = (WORD, WORD, HALF, WORD)
    driver, fast = _launcher(monkeypatch, words + SCRATCH, words)
    assert isinstance(fast, driver_launch.DriverLaunch)
    assert fast(7, 2**40 + 16, 32, 3 * 4 * 8, 2**33)
    assert fast(300, 48, 2**47, 40, 16)  # every slot written again
    assert [d["values"] for d in driver.launches] == [[2**40 + 16, 32, 96, 2**33, 0, 0], [48, 2**47, 40, 16, 0, 0]]
    assert [d["grid"] for d in driver.launches] == [(7, 1, 1), (300, 1, 1)]
    assert driver.launches[0]["block"] == (128, 1, 1) and driver.launches[0]["shared"] == 64


def test_a_launch_the_driver_refuses_is_said_and_reported_to_the_caller(monkeypatch, caplog):
    """A refused launch must not raise into vLLM's forward: the caller is told (False) and falls
    back to Triton's launch; the log names the kernel and the driver's error."""
    driver, fast = _launcher(monkeypatch, (WORD,) + SCRATCH, (WORD,), rc=1)
    with caplog.at_level("ERROR", logger="vllm.hotwire"):
        assert fast(3, 64) is False
    assert len(driver.launches) == 1
    assert "refused to launch kernel (CUDA_ERROR_INVALID_VALUE)" in caplog.text


@pytest.mark.parametrize("sizes,why", [
    ((WORD, WORD, WORD, WORD) + SCRATCH, "the int32 parameter widened to int64"),
    ((WORD, WORD, WORD) + SCRATCH, "a parameter specialised away"),
    ((WORD, WORD, HALF, WORD, HALF), "a trailing parameter that is not a scratch pointer"),
])
def test_a_kernel_whose_parameters_differ_keeps_tritons_launch(monkeypatch, sizes, why):
    assert _launcher(monkeypatch, sizes, (WORD, WORD, HALF, WORD))[1] is None, why


@pytest.mark.parametrize("meta", [dict(global_scratch_size=128), dict(num_ctas=2), dict(cluster_dims=(2, 1, 1)),
                                  dict(launch_pdl=True)])
def test_a_kernel_asking_for_more_than_a_plain_launch_keeps_tritons_launch(monkeypatch, meta):
    assert _launcher(monkeypatch, (WORD,) + SCRATCH, (WORD,), _compiled(**meta))[1] is None


def test_without_the_driver_or_a_compiled_kernel_tritons_launch_stays(monkeypatch):
    monkeypatch.setattr(driver_launch, "_driver", lambda: None)
    assert driver_launch.launcher(_compiled(), (WORD,), 0) is None
    assert _launcher(monkeypatch, (WORD,) + SCRATCH, (WORD,), compiled=SimpleNamespace())[1] is None  # the interpreter's
