"""The control API's ``/metrics``, scraped from a real server on a real mailbox, against
Prometheus' naming rules; the README's metric names, and the series and labels the alert rules
and the Grafana dashboard in deploy/ query, against what is exposed.

Known violations are listed in :data:`KNOWN`: fixing them renames series that other tests or the
README use. A new violation fails, and so does a listed one that is gone (prune the list).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from control_harness import FP, Rig, exact_vector
from monitoring_files import all_exprs, label_names, series_names

README = Path(__file__).resolve().parents[1] / "README.md"
NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
BASE_UNITS = ("seconds", "bytes")
# Words that name a unit, or a quantity that needs one: the name must then end in a base unit.
UNIT_WORDS = {"second", "seconds", "sec", "secs", "ms", "millis", "milliseconds", "us",
              "microseconds", "ns", "nanos", "nanoseconds", "minutes", "hours", "byte", "bytes",
              "kb", "mb", "gb", "kib", "mib", "gib", "age", "duration", "latency", "time"}
HTTP_STATUS_LABELS = {"status", "status_code", "http_status", "http_code"}
HISTOGRAM_SUFFIXES = ("_count", "_sum", "_bucket")
# A metric name in the README; a quoted one is a request field ("hotwire_strict": true)
README_METRIC = re.compile(r'(?<!["\w])hotwire_[a-z_]+(?!["\w])')
# Labels Prometheus adds to every scraped series (the ServiceMonitor adds pod, namespace, ...)
TARGET_LABELS = {"instance", "job"}

KNOWN: set[str] = set()


@pytest.fixture(scope="module")
def exposition(tmp_path_factory) -> str:
    """``/metrics`` after an upload, a refused upload and an unsteered request."""
    rig = Rig(tmp_path_factory.mktemp("metrics"))
    rig.start_engine()
    rig.start_api()
    try:
        assert rig.push("named", exact_vector(FP.hidden)).status_code == 201
        assert rig.push("named", exact_vector(FP.hidden)).status_code == 409
        rig.engine.box.add_counter("unsteered_unknown_id", 1)
        rig.engine.box.flush_counters()
        response = rig.http.get("/metrics")
        assert response.status_code == 200, response.text
        return response.text
    finally:
        rig.stop()


def families(text: str) -> dict[str, str]:
    """Exposed family name -> type, from the ``# TYPE`` lines."""
    found = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            found[name] = kind
    return found


def sample_labels(text: str) -> dict[str, set[str]]:
    """Sample name -> label names seen on it."""
    found: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, rest = line.partition("{")
            name = name.split(" ")[0]
            labels = re.findall(r'([^,{}=]+)="', rest) if rest else []
            found.setdefault(name, set()).update(labels)
    return found


def naming_violations(text: str) -> set[str]:
    """Every break of Prometheus' naming rules in an exposition."""
    bad = set()
    for name, kind in families(text).items():
        if not NAME.fullmatch(name):
            bad.add(f"{name}: not a valid metric name")
        if not name.startswith("hotwire_"):
            bad.add(f"{name}: not in the hotwire_ namespace")
        if kind == "counter" and not name.endswith("_total"):
            bad.add(f"{name}: a counter not ending in _total")
        if kind != "counter" and name.endswith("_total"):
            bad.add(f"{name}: a {kind} named like a counter (_total)")
        if kind not in ("histogram", "summary") and name.endswith(HISTOGRAM_SUFFIXES):
            bad.add(f"{name}: a {kind} with a histogram/summary suffix")
        base = name.removesuffix("_total").removesuffix("_created")
        words = set(base.split("_"))
        if words & UNIT_WORDS and not base.endswith(tuple(f"_{u}" for u in BASE_UNITS)):
            bad.add(f"{name}: mentions a unit ({', '.join(sorted(words & UNIT_WORDS))}) without "
                    f"a base-unit suffix ({', '.join(BASE_UNITS)})")
    for name, labels in sample_labels(text).items():
        for label in labels:
            if not LABEL.fullmatch(label) or label.startswith("__"):
                bad.add(f"{name}: invalid label name {label!r}")
            if label in HTTP_STATUS_LABELS and not name.endswith("_created"):
                bad.add(f"{name}: HTTP status label {label!r}, Prometheus' convention is 'code'")
    return bad


def readme_violations(text: str) -> set[str]:
    """README metric names that the exposition does not have."""
    exposed = set(families(text)) | set(sample_labels(text))
    named = set(README_METRIC.findall(README.read_text()))
    bad = set()
    for name in sorted(named - exposed):
        hint = f", exposed as {name}_total" if f"{name}_total" in exposed else " (not exposed)"
        bad.add(f"README names {name}{hint}")
    return bad


def check(found: set[str], known: set[str]) -> None:
    assert found - known == set(), "new violations"
    assert known - found == set(), "fixed: remove these from KNOWN"


def test_every_metric_follows_prometheus_naming_rules(exposition):
    assert len(families(exposition)) >= 15
    check(naming_violations(exposition), {k for k in KNOWN if not k.startswith("README")})


def test_every_metric_the_readme_names_is_exposed(exposition):
    assert README_METRIC.findall(README.read_text()), "the README names no metric"
    check(readme_violations(exposition), {k for k in KNOWN if k.startswith("README")})


def test_the_rules_catch_each_kind_of_violation():
    """The checker itself, on a hand-written exposition with one break per rule."""
    text = "\n".join([
        "# TYPE hotwire_ok_total counter", 'hotwire_ok_total{code="200"} 1',
        "# TYPE hotwire_requests counter", "hotwire_requests 1",
        "# TYPE hotwire_queue_total gauge", "hotwire_queue_total 1",
        "# TYPE hotwire_steps_count gauge", "hotwire_steps_count 1",
        "# TYPE hotwire_latency_ms gauge", "hotwire_latency_ms 1",
        "# TYPE hotwire_wait_seconds_total counter", 'hotwire_wait_seconds_total{status="500"} 1',
        "# TYPE process_open_fds gauge", "process_open_fds 1",
    ])
    assert naming_violations(text) == {
        "hotwire_requests: a counter not ending in _total",
        "hotwire_queue_total: a gauge named like a counter (_total)",
        "hotwire_steps_count: a gauge with a histogram/summary suffix",
        "hotwire_latency_ms: mentions a unit (latency, ms) without a base-unit suffix "
        "(seconds, bytes)",
        "hotwire_wait_seconds_total: HTTP status label 'status', Prometheus' convention is 'code'",
        "process_open_fds: not in the hotwire_ namespace",
    }


def query_violations(text: str, exprs: list[str]) -> set[str]:
    """Series and labels the expressions use that the exposition does not have."""
    samples = sample_labels(text)
    bad = set()
    for expr in exprs:
        names = series_names(expr)
        if not names:
            bad.add(f"{expr!r}: selects no series")
        for name in sorted(names - set(samples)):
            hint = f" (exposed as {name}_total)" if f"{name}_total" in samples else ""
            bad.add(f"{expr!r}: {name} is not exposed{hint}")
        known = TARGET_LABELS.union(*(samples.get(n, set()) for n in names))
        for label in sorted(label_names(expr) - known):
            bad.add(f"{expr!r}: label {label} is on none of {sorted(names)}")
    return bad


def test_alerts_and_dashboard_query_only_exposed_series_and_labels(exposition):
    exprs = all_exprs()
    assert len(exprs) >= 20
    assert query_violations(exposition, exprs) == set()


def test_the_query_check_catches_unknown_series_and_labels(exposition):
    assert query_violations(exposition, [
        "rate(hotwire_engine_steps_total[5m])",  # fine
        "rate(hotwire_engine_steps[5m])",  # a counter without _total
        'sum by (code) (hotwire_slots_used{reason="x"})',  # labels that series does not have
        "1 > 0",
    ]) == {
        "'rate(hotwire_engine_steps[5m])': hotwire_engine_steps is not exposed "
        "(exposed as hotwire_engine_steps_total)",
        "'sum by (code) (hotwire_slots_used{reason=\"x\"})': label code is on none of "
        "['hotwire_slots_used']",
        "'sum by (code) (hotwire_slots_used{reason=\"x\"})': label reason is on none of "
        "['hotwire_slots_used']",
        "'1 > 0': selects no series",
    }
