"""A CUDA driver that refuses every launch, for the fallback tests run in Triton's interpreter
(test_steering_op.py, test_upload_kernel.py): each compiled kernel's driver launch reports a
refusal, as :class:`hotwire.engine_plugin.driver_launch.DriverLaunch` does."""

from hotwire.engine_plugin import driver_launch


def refuse_every_launch() -> list[int]:
    """Patch :func:`driver_launch.launcher` so that every driver launch is refused; returns the
    grids the driver was asked to launch, in order."""
    tries: list[int] = []

    def refused(grid: int, *words: int) -> bool:
        tries.append(grid)
        return False

    driver_launch.launcher = lambda compiled, sizes, device: refused
    return tries
