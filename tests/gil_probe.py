"""Does a call let the GIL go? A spinner thread keeps the GIL for as long as it is let to (a
switch interval of 1 s), so it takes the GIL whenever the call lets it go, if it wakes before the
call takes it back: that call then lasts ~1 s instead of microseconds. The spinner may not wake in
time, so a call gets many chances; a release of a microsecond or two may still go unseen (numpy on
1,500 elements passed 3 runs of 3), so give the call inputs large enough to make a release long."""

import gc
import sys
import threading
import time
from collections.abc import Callable

SLOW_S = 0.2  # a call this long waited for the spinner


def longest_call(call: Callable[[int], object], times: int = 200) -> float:
    """The longest of ``call(0)``, ``call(1)``, ... (up to ``times`` calls, stopping at the first
    slow one) while the spinner runs. Earlier garbage is collected first and no collection runs in
    the loop: a collection runs finalizers (a file closed lets the GIL go), not the call's doing."""
    stop, old = threading.Event(), sys.getswitchinterval()
    gc.collect()
    gc.disable()
    sys.setswitchinterval(1.0)
    spinner = threading.Thread(target=lambda: [None for _ in iter(stop.is_set, True)])
    took = [0.0]
    try:
        spinner.start()
        time.sleep(0.01)  # the spinner runs; this thread then waits out its interval for the GIL
        for k in range(times):
            t = time.perf_counter()
            call(k)
            took.append(time.perf_counter() - t)
            if took[-1] > SLOW_S:
                break
    finally:
        stop.set()
        sys.setswitchinterval(old)
        gc.enable()
        spinner.join()
    return max(took)
