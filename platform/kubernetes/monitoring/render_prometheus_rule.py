"""Write prometheus-rule.yaml, the Prometheus Operator's PrometheusRule, from the one source of
OGAI's alert rules, platform/prometheus/rules.yml (which compose's Prometheus loads as it is).

    python platform/kubernetes/monitoring/render_prometheus_rule.py          # rewrite it
    python platform/kubernetes/monitoring/render_prometheus_rule.py --check  # exit 1 if stale

A plain script, no package: a package named `platform` would shadow the standard library's.
"""

import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE.parent.parent / "prometheus" / "rules.yml"
OUTPUT = HERE / "prometheus-rule.yaml"
HEADER = ("# Generated from platform/prometheus/rules.yml by render_prometheus_rule.py beside it:"
          "\n# edit the rules there and run the script; a test fails while this file is stale.\n")


def render() -> str:
    rules = yaml.safe_load(RULES.read_text())
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        # kube-prometheus-stack's Prometheus picks rules by its release label by default.
        "metadata": {"name": "ogai", "labels": {"app.kubernetes.io/name": "ogai",
                                                "release": "kube-prometheus-stack"}},
        "spec": {"groups": rules["groups"]},
    }
    return HEADER + yaml.safe_dump(rule, sort_keys=False, width=100, allow_unicode=True)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
