"""The operators' files in deploy/: Prometheus alert rules, the Grafana dashboard, and the
PromQL expressions they hold (read by test_monitoring.py and test_metrics_names.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RULES_FILE = ROOT / "deploy" / "prometheus" / "hotwire-alerts.yaml"
DASHBOARD_FILE = ROOT / "deploy" / "grafana" / "hotwire.json"

# Grafana's variables in a query, and what stands in for each when the query is checked as PromQL
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$instance": ".*"}


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES_FILE.read_text())["groups"] for rule in group["rules"]]


def dashboard() -> dict:
    return json.loads(DASHBOARD_FILE.read_text())


def dashboard_exprs() -> list[str]:
    """Every panel query, with Grafana's variables replaced, as Prometheus would run it."""
    exprs = []
    for panel in dashboard()["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"an unknown variable in {target['expr']!r}"
            exprs.append(expr)
    return exprs


def all_exprs() -> list[str]:
    return [rule["expr"] for rule in rules()] + dashboard_exprs()


# A PromQL expression's words that are not series names: functions, operators, keywords.
PROMQL_WORDS = {"sum", "min", "max", "avg", "count", "rate", "irate", "increase", "by", "without",
                "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset",
                "bool", "topk", "bottomk", "quantile", "histogram_quantile", "clamp_min", "abs",
                "absent", "label_values"}


def series_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers outside label matchers, grouping
    clauses and range durations, that are not PromQL's own words."""
    text = re.sub(r'\{[^}]*\}', "", expr)  # label matchers
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", text)
    text = re.sub(r"\[[^\]]*\]", "", text)  # range durations
    words = set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b", text))
    return {w for w in words if w not in PROMQL_WORDS and not re.fullmatch(r"\d+[smhdwy]?", w)}


def label_names(expr: str) -> set[str]:
    """Labels an expression matches on or groups by."""
    names = set()
    for clause in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
        names |= {n.strip() for n in clause.split(",") if n.strip()}
    for matchers in re.findall(r"\{([^}]*)\}", expr):
        names |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    return names
