"""benchmarks/kernel_diff.py reads inductor's output-code log as TORCH_LOGS writes it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

from kernel_diff import kernels  # noqa: E402


def _log(kernel: str, body: str, pid: int) -> str:
    """One kernel as ``TORCH_LOGS=output_code`` logs it: every line behind a per-process prefix."""
    prefix = f"[rank0]:V1130 15:23:11.{pid:06d} {pid} torch/_inductor/graph.py:2552] [__output_code] "
    lines = [f"{kernel} = async_compile.triton('{kernel}', '''", "@triton.jit", f"def {kernel}(in_ptr0):",
             f"    {body}", "''', device_str='cuda')"]
    return "\n".join(prefix + line for line in lines) + "\nunrelated line\n"


def test_same_kernels_in_two_processes_compare_equal():
    a = kernels(_log("triton_per_fused_add_3", "tl.store(in_ptr0, 1)", 11) +
                _log("triton_per_fused_add_7", "tl.store(in_ptr0, 1)", 11))
    b = kernels(_log("triton_per_fused_add_0", "tl.store(in_ptr0, 1)", 22))
    assert set(a) == set(b)  # log prefixes and inductor's numbering are not part of a kernel
    assert sum(a.values()) == 2 and sum(b.values()) == 1
    (name, src), = a
    assert name == "triton_per_fused_add" and "def triton_per_fused_add(in_ptr0)" in src


def test_a_changed_body_is_a_different_kernel():
    a = kernels(_log("triton_per_fused_add_3", "tl.store(in_ptr0, 1)", 11))
    b = kernels(_log("triton_per_fused_add_3", "tl.store(in_ptr0, 2)", 11))
    assert set(a) != set(b)
