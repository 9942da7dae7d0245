"""``hotwire control-api`` keeps a client's kept-alive connection through a stall of its own.

uvicorn closes a connection idle for its keep-alive timeout (5 s by default), and under uvloop a
process that comes back from a stall runs its due timers before it reads its sockets: a request
sent during a stall of over 5 s (a starved CPU, a long pause) is dropped unanswered, and the
client sees "Server disconnected without sending a response". Seen in fresh-clone CI on two
cores beside a CPU engine. The test stalls the process with SIGSTOP and sends a request into the
stall on a connection that has just answered.
"""

import os
import signal
import threading

from control_harness import EnginePump
from servers import ControlApi

STALL_S = 7.0  # past uvicorn's default keep-alive (5 s), well inside the control API's own


def test_a_request_sent_into_a_stall_is_answered_on_its_kept_alive_connection(tmp_path):
    engine = EnginePump(tmp_path / "engine.mbx", n_slots=4)
    api = ControlApi(tmp_path / "control", engine.path)
    try:
        api.start(ready=False, timeout=60)
        client = api.http()
        assert client.get("/healthz").status_code == 200
        pid = api.proc.pid
        os.kill(pid, signal.SIGSTOP)
        resume = threading.Timer(STALL_S, os.kill, (pid, signal.SIGCONT))
        resume.start()
        try:
            r = client.get("/healthz")  # sent during the stall, answered after it
        finally:
            resume.join()
        assert r.status_code == 200
    finally:
        api.stop()
        engine.stop()
