"""Benchmark only: the server kind ``hotwire_host_only`` (``server_kinds.py``) puts this folder on
its ``PYTHONPATH``, so that Python imports this module at start in every process of the server.

It makes every step of hotwire an idle one on the GPU: the router still admits, stages and uploads
as deployed, but each step replays the graphs without the op and a step run without a graph
launches none (``idle_graphs.select`` is always told "idle"). Beside ``hotwire``, what the op and
its graphs cost on the GPU; beside plugin-free, what steering's host work costs.
"""

from hotwire.engine_plugin import idle_graphs

_select = idle_graphs.select
idle_graphs.select = lambda idle: _select(True)
