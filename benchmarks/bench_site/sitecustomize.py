"""Benchmark only: what a served benchmark adds to a server's processes. A server whose
``PYTHONPATH`` starts with this folder imports this module as Python starts, in every process:

* ``BENCH_OP_OFF`` set: :mod:`op_off` keeps hotwire's op off the GPU somewhere (``server_kinds.py``).
* ``BENCH_UPLOADS`` set: :mod:`uploads` changes how hotwire's routing uploads reach the device.
* ``BENCH_FRONTEND=off``: :mod:`frontend_off` leaves hotwire's API-server middleware out.
* ``BENCH_PHASES_DIR`` set: :mod:`step_phases` times the engine core's step phase by phase.
"""

import os

if os.environ.get("BENCH_OP_OFF"):
    import op_off  # noqa: F401
if os.environ.get("BENCH_UPLOADS"):
    import uploads  # noqa: F401
if os.environ.get("BENCH_FRONTEND"):
    import frontend_off  # noqa: F401
if os.environ.get("BENCH_PHASES_DIR"):
    import step_phases

    step_phases.install()
