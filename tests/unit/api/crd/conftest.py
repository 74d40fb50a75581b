"""Kube's own example CRD schemas (the CronTab of the Kubernetes docs, list-map and CEL examples)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

CRONTAB: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "cronSpec": {"type": "string", "pattern": r"^(\d+|\*)(/\d+)?(\s+(\d+|\*)(/\d+)?){4}$"},
                "image": {"type": "string"},
                "replicas": {"type": "integer", "minimum": 1, "maximum": 10, "default": 1},
            },
        },
    },
}


@pytest.fixture
def crontab() -> dict[str, Any]:
    return copy.deepcopy(CRONTAB)
