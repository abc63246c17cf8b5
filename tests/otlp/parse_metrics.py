#!/usr/bin/env python3
"""Parses a metrics page (stdin) with the Prometheus project's own parsers (PyPI
`prometheus-client`): the OpenMetrics one, and the classic text one. Prints each sample as
a JSON line {name, labels, value}; a page either parser refuses is an error."""
import json
import sys

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
from prometheus_client.parser import text_string_to_metric_families as classic

text = sys.stdin.read()
list(classic(text))
for family in openmetrics(text):
    for s in family.samples:
        print(json.dumps({"family": family.name, "type": family.type, "name": s.name,
                          "labels": s.labels, "value": s.value}))
