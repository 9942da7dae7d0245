"""The operators' files: Prometheus alert rules, the Grafana dashboard and the ServiceMonitor.

Structure is checked here in Python; the PromQL itself by ``promtool`` (Debian's `prometheus`
package, which .ci/run installs): ``promtool check rules`` on the rules and on the dashboard's
queries, and ``promtool test rules`` on series that must fire each alert, and must not before.
Without promtool those tests skip. test_metrics_names.py checks that every name these
expressions use is one a real control API exposes.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from hotwire.control_api.api.app import create_app
from hotwire.control_api.api.settings import Settings
from monitoring_files import DASHBOARD_FILE, ROOT, RULES_FILE, dashboard, dashboard_exprs, rules

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed "
                                    "(apt-get install prometheus)")
K8S = ROOT / "deploy" / "k8s"

# What an operator must be able to see, by the series that show it.
MUST_SHOW = {
    "unsteered rate by reason": "hotwire_engine_unsteered_requests_total",
    "heartbeat age": "hotwire_engine_heartbeat_age_seconds",
    "slot pressure": "hotwire_slots_used",
    "sync lag": "hotwire_mailbox_unapplied_generations",
    "host share": "hotwire_engine_host_seconds_total",
}


def promtool(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


# Alert rules ------------------------------------------------------------------------------

def test_alert_rules_are_named_labelled_and_explained():
    names = [rule["alert"] for rule in rules()]
    assert len(names) == len(set(names)) >= 8
    for rule in rules():
        assert re.fullmatch(r"Hotwire[A-Z][A-Za-z]+", rule["alert"]), rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert re.fullmatch(r"\d+m", rule["for"]), "a pending period: no alert on one scrape"
        assert set(rule["annotations"]) == {"summary", "description"}
        assert "{{" not in rule["annotations"]["description"], "templates go in the summary"


def test_alert_rules_and_dashboard_cover_what_operators_must_see():
    rule_text = " ".join(rule["expr"] for rule in rules())
    dash_text = " ".join(dashboard_exprs())
    for what, series in MUST_SHOW.items():
        assert series in dash_text, f"the dashboard does not show {what}"
        assert series in rule_text, f"no alert on {what}"
    assert any(re.search(r"by \([^)]*\breason\b", e) for e in dashboard_exprs()), "by reason"


@needs_promtool
def test_promtool_accepts_the_alert_rules():
    run = promtool("check", "rules", RULES_FILE)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(rules())} rules found" in run.stdout


A = 'instance="a:8001"'
R0 = f'{A}, dp_rank="0"'
# alert -> (input series, when it must be quiet, when it must fire, its labels, its summary)
CASES = {
    "HotwireEngineDetached": (
        {f"hotwire_engine_attached{{{R0}}}": "1x10 0x20"}, "12m", "20m",
        {"severity": "warning", "instance": "a:8001", "dp_rank": "0"},
        "hotwire control API a:8001 has no engine mailbox (DP rank 0)"),
    "HotwireHeartbeatStale": (
        {f"hotwire_engine_heartbeat_age_seconds{{{R0}}}": "0.2x10 60x20"}, "11m", "20m",
        {"severity": "critical", "instance": "a:8001", "dp_rank": "0"},
        "hotwire engine heartbeat is 1m 0s old on a:8001 (DP rank 0)"),
    "HotwireMailboxOutOfSync": (
        {f"hotwire_mailbox_unapplied_generations{{{R0}}}": "0x10 2x20"}, "14m", "20m",
        {"severity": "warning", "instance": "a:8001", "dp_rank": "0"},
        "hotwire engine on a:8001 has not applied 2 mailbox generation(s) for 5 minutes"),
    "HotwireCatalogNotWritable": (
        {f"hotwire_catalog_writable{{{A}}}": "1x10 0x10"}, "11m", "15m",
        {"severity": "critical", "instance": "a:8001"},
        "hotwire catalog on a:8001 cannot persist writes"),
    "HotwireRequestsUnsteered": (
        {f"hotwire_engine_steered_requests_total{{{R0}}}": "0+90x40",
         f'hotwire_engine_unsteered_requests_total{{{R0}, reason="unknown_id"}}': "0x10 0+10x30",
         f'hotwire_engine_unsteered_requests_total{{{R0}, reason="malformed"}}': "0x40"},
        "10m", "35m", {"severity": "warning", "instance": "a:8001", "reason": "unknown_id"},
        "10% of steering requests on a:8001 run unsteered (unknown_id)"),
    "HotwireSlotsNearlyFull": (
        {f"hotwire_slots_used{{{R0}}}": "500x10 950x30", f"hotwire_slots_capacity{{{R0}}}": "1000x40"},
        "20m", "35m", {"severity": "warning", "instance": "a:8001", "dp_rank": "0"},
        "hotwire engine on a:8001 uses 95% of its slots"),
    "HotwireEvictionChurn": (
        {f"hotwire_evicted_vectors_total{{{R0}}}": "0x10 0+2x40"}, "20m", "45m",
        {"severity": "warning", "instance": "a:8001", "dp_rank": "0"},
        "hotwire engine on a:8001 evicts 0.033 vectors/s"),
    "HotwireHostShareHigh": (
        {f"hotwire_engine_host_seconds_total{{{R0}}}": "0x10 0+6x30"}, "20m", "38m",
        {"severity": "warning", "instance": "a:8001", "dp_rank": "0"},
        "hotwire's per-step host work takes 10% of the engine's step thread on a:8001"),
    "HotwireUploadsFailing": (
        {f'hotwire_uploads_total{{{A}, code="201"}}': "0+5x40",
         f'hotwire_uploads_total{{{A}, code="503"}}': "0x10 0+1x30"}, "15m", "30m",
        {"severity": "warning", "instance": "a:8001"},
        "vector uploads to a:8001 fail with 5xx"),
}


def test_every_alert_has_a_firing_case():
    assert set(CASES) == {rule["alert"] for rule in rules()}


@needs_promtool
def test_each_alert_fires_on_its_series_and_not_before(tmp_path):
    descriptions = {rule["alert"]: rule["annotations"]["description"] for rule in rules()}
    tests = []
    for alert, (series, quiet, fires, labels, summary) in CASES.items():
        tests.append({
            "interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in series.items()],
            "alert_rule_test": [
                {"eval_time": quiet, "alertname": alert, "exp_alerts": []},
                {"eval_time": fires, "alertname": alert, "exp_alerts": [{
                    "exp_labels": labels,
                    "exp_annotations": {"summary": summary, "description": descriptions[alert]}}]},
            ],
        })
    spec = tmp_path / "hotwire-alerts.test.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(RULES_FILE)], "evaluation_interval": "1m",
                                    "tests": tests}, sort_keys=False))
    run = promtool("test", "rules", spec)
    assert run.returncode == 0, run.stdout + run.stderr
    # and the check can fail: a summary that is not what the alert renders
    tests[0]["alert_rule_test"][1]["exp_alerts"][0]["exp_annotations"]["summary"] = "something else"
    spec.write_text(yaml.safe_dump({"rule_files": [str(RULES_FILE)], "evaluation_interval": "1m",
                                    "tests": tests[:1]}, sort_keys=False))
    assert promtool("test", "rules", spec).returncode != 0


# Grafana dashboard ------------------------------------------------------------------------

def test_dashboard_is_a_grafana_dashboard_on_a_chosen_prometheus():
    dash = dashboard()
    assert dash["uid"] == "hotwire" and dash["title"] and isinstance(dash["schemaVersion"], int)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    source = {"type": "prometheus", "uid": "${datasource}"}
    panels = dash["panels"]
    assert len({p["id"] for p in panels}) == len(panels) >= len(MUST_SHOW)
    for panel in panels:
        assert panel["datasource"] == source and panel["title"] and panel["description"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs)
        assert all(t["datasource"] == source and t["expr"].strip() for t in panel["targets"])
        assert panel["fieldConfig"]["defaults"]["unit"]


def test_dashboard_panels_do_not_overlap():
    cells = {}
    for panel in dashboard()["panels"]:
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]


def test_dashboard_instance_variable_lists_the_control_apis():
    [instance] = [v for v in dashboard()["templating"]["list"] if v["name"] == "instance"]
    assert instance["query"]["query"] == instance["definition"]
    assert re.fullmatch(r"label_values\(hotwire_\w+, instance\)", instance["definition"])
    assert all('instance=~"$instance"' in t["expr"]
               for p in dashboard()["panels"] for t in p["targets"])


@needs_promtool
def test_promtool_parses_every_dashboard_query(tmp_path):
    """Each query, its Grafana variables filled in, as a recording rule for promtool to parse."""
    exprs = dashboard_exprs()
    records = [{"record": f"hotwire:dashboard_query_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    run = promtool("check", "rules", path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in run.stdout
    path.write_text(yaml.safe_dump({"groups": [{"name": "broken", "rules": [
        {"record": "hotwire:broken", "expr": exprs[0].replace(")", "", 1)}]}]}))
    assert promtool("check", "rules", path).returncode != 0, "promtool checks the syntax"


def test_dashboard_file_is_committed_as_formatted_json():
    text = DASHBOARD_FILE.read_text()
    assert text == json.dumps(json.loads(text), indent=2) + "\n"


# ServiceMonitor ---------------------------------------------------------------------------

def _k8s_docs(name: str) -> list[dict]:
    return list(yaml.safe_load_all((K8S / name).read_text()))


def test_service_monitor_scrapes_every_control_api_and_nothing_else():
    [monitor] = _k8s_docs("servicemonitor.yaml")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "ServiceMonitor"
    wanted = monitor["spec"]["selector"]["matchLabels"]
    services = [d for f in ("hotwire.yaml", "hotwire-replicas.yaml") for d in _k8s_docs(f)
                if d["kind"] == "Service"]
    picked = [s for s in services if wanted.items() <= s["metadata"].get("labels", {}).items()]
    assert {s["metadata"]["name"] for s in picked} == {"hotwire-control", "hotwire-replicas-control"}
    [endpoint] = monitor["spec"]["endpoints"]
    routes = create_app(Settings()).openapi()["paths"]
    assert endpoint["path"] in routes and "get" in routes[endpoint["path"]]
    for service in picked:
        [port] = service["spec"]["ports"]
        assert port["name"] == endpoint["port"] and port["port"] == Settings().port
        assert service["spec"]["publishNotReadyAddresses"] is True, "an unready engine is scraped"
