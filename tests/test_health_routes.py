"""``/healthz`` and ``/readyz`` (control_api.api.routers.health): ready only while the engine
beats and applies what it is sent.
"""

from __future__ import annotations

import threading
import time

from control_harness import FP, Rig, exact_vector, wait_until
from hotwire.shared.mailbox import clock_ns

H = FP.hidden


def test_readyz_fails_on_a_stale_heartbeat(rig):
    assert rig.http.get("/readyz").status_code == 200
    assert rig.http.get("/healthz").json() == {"status": "ok"}
    rig.engine.paused.set()
    rig.engine.box.beat(at_ns=clock_ns() - 60 * 10**9)
    r = rig.http.get("/readyz")
    assert r.status_code == 503 and "heartbeat" in r.json()["reason"]
    assert rig.http.get("/healthz").status_code == 200
    rig.engine.paused.clear()
    wait_until(lambda: rig.http.get("/readyz").status_code == 200, what="ready again")


def test_readyz_fails_when_the_engine_stops_applying(tmp_path):
    rig = Rig(tmp_path, heartbeat_timeout_s=0.5)
    rig.start_engine()
    rig.start_api()
    rig.engine.paused.set()  # from here the engine beats (below) but runs no step
    stop_beating = threading.Event()

    def beat_only():
        while not stop_beating.wait(0.05):
            rig.engine.box.beat()

    beater = threading.Thread(target=beat_only)
    beater.start()
    try:
        # A fresh engine applies at its first step: waiting for that is not "out of sync".
        assert rig.push("early", exact_vector(H)).status_code == 201
        time.sleep(1.0)
        assert rig.http.get("/readyz").status_code == 200
        rig.engine.step()
        assert rig.push("late", exact_vector(H)).status_code == 201
        r = wait_until(lambda: (x := rig.http.get("/readyz")).status_code == 503 and x)
        assert "not applied" in r.json()["reason"]
        stop_beating.set()
        beater.join()
        rig.engine.paused.clear()
        wait_until(lambda: rig.http.get("/readyz").status_code == 200)
    finally:
        stop_beating.set()
        rig.stop()
