"""The CustomResourceDefinition kind (fleet/api/kinds/apiextensions.py), the CR kinds built from it
(fleet/api/crd/resource.py), the printer columns (columns.py) and the naming plan of the CRD
controller (fleet/server/crd_controller.py): pure parts, kube's words."""

from __future__ import annotations

import copy
from typing import Any

import trio

from fleet.api.crd import columns
from fleet.api.crd.resource import kinds_for
from fleet.api.kinds.apiextensions import default_crd, validate_crd
from fleet.api.registry import Registry, default_registry
from fleet.server import crd_conversion
from fleet.server.crd_controller import Registrar, names_plan

SCHEMA = {"type": "object", "properties": {
    "spec": {"type": "object", "properties": {"replicas": {"type": "integer", "default": 1, "maximum": 5},
                                              "image": {"type": "string"}}},
    "status": {"type": "object", "properties": {"phase": {"type": "string"}}}}}


def crd(**over: Any) -> dict[str, Any]:
    obj = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "crontabs.stable.example.com"},
           "spec": {"group": "stable.example.com", "scope": "Namespaced",
                    "names": {"plural": "crontabs", "kind": "CronTab", "shortNames": ["ct"]},
                    "versions": [{"name": "v1", "served": True, "storage": True,
                                  "schema": {"openAPIV3Schema": copy.deepcopy(SCHEMA)},
                                  "subresources": {"status": {}}}]}}
    obj["spec"].update(over)
    default_crd(obj)
    return obj


def messages(obj: dict[str, Any]) -> list[str]:
    return [f"{c['field']}: {c['message']}" for c in validate_crd(obj, None)]


def test_defaults() -> None:
    c = crd()
    assert c["spec"]["names"]["singular"] == "crontab"
    assert c["spec"]["names"]["listKind"] == "CronTabList"
    assert c["spec"]["conversion"] == {"strategy": "None"}
    assert messages(c) == []


def test_every_violation_listed() -> None:
    c = crd(scope="Global")
    c["metadata"]["name"] = "wrong.example.com"
    c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["x"] = {}
    c["spec"]["versions"][0]["additionalPrinterColumns"] = [{"name": "X", "type": "color", "jsonPath": "spec.x"}]
    c["spec"]["versions"][0]["subresources"]["scale"] = {"specReplicasPath": ".status.r",
                                                         "statusReplicasPath": ".status.r"}
    c["spec"]["versions"].append({"name": "v1", "served": True, "storage": True,
                                  "schema": {"openAPIV3Schema": {"type": "object"}}})
    got = messages(c)
    assert 'metadata.name: Invalid value: "wrong.example.com": must be spec.names.plural+"."+spec.group' in got
    assert 'spec.scope: Unsupported value: "Global": supported values: "Cluster", "Namespaced"' in got
    assert ("spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[x].type: Required value: "
            "must not be empty for specified object fields") in got
    assert ('spec.versions[0].additionalPrinterColumns[0].type: Unsupported value: "color": supported values: '
            '"boolean", "date", "integer", "number", "string"') in got
    assert ('spec.versions[0].additionalPrinterColumns[0].JSONPath: Invalid value: "spec.x": must be a simple '
            'json path starting with .') in got
    assert ('spec.versions[0].subresources.scale.specReplicasPath: Invalid value: ".status.r": should be a json '
            'path under .spec') in got
    assert any(m.startswith("spec.versions: Invalid value:") and m.endswith("must contain unique version names")
               for m in got)
    assert any(m.endswith("must have exactly one version marked as storage version") for m in got)


def test_group_scope_and_schema_required() -> None:
    c = crd(group="example")
    c["metadata"]["name"] = "crontabs.example"
    del c["spec"]["versions"][0]["schema"]
    got = messages(c)
    assert 'spec.group: Invalid value: "example": should be a domain with at least one dot' in got
    assert "spec.versions[0].schema.openAPIV3Schema: Required value: schemas are required" in got


def test_cel_cost_refused_at_creation() -> None:
    c = crd()
    spec = c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["tags"] = {"type": "array", "items": {"type": "string"}}
    spec["x-kubernetes-validations"] = [{"rule": "self.tags.all(x, self.tags.exists_one(y, x == y))"}]
    assert any("estimated rule cost exceeds budget" in m for m in messages(c))
    spec["properties"]["tags"]["maxItems"] = 32
    assert messages(c) == []


def test_webhook_conversion_fields() -> None:
    c = crd(conversion={"strategy": "Webhook", "webhook": {"clientConfig": {"url": "http://x"}}})
    got = messages(c)
    assert 'spec.conversion.webhook.clientConfig.url: Invalid value: "http://x": \'https\' is the only allowed URL scheme' in got
    assert any(m.startswith("spec.conversion.webhook.conversionReviewVersions") for m in got)


def established(c: dict[str, Any]) -> dict[str, Any]:
    c = copy.deepcopy(c)
    c["status"] = names_plan(c, [], [], "2026-01-01T00:00:00Z")
    return c


def test_names_plan_accepts_then_conflicts() -> None:
    c = established(crd())
    conds = {x["type"]: x for x in c["status"]["conditions"]}
    assert (conds["NamesAccepted"]["status"], conds["NamesAccepted"]["reason"]) == ("True", "NoConflicts")
    assert conds["NamesAccepted"]["message"] == "no conflicts found"
    assert (conds["Established"]["reason"], conds["Established"]["message"]) == (
        "InitialNamesAccepted", "the initial names have been accepted")
    assert c["status"]["acceptedNames"]["shortNames"] == ["ct"] and c["status"]["storedVersions"] == ["v1"]
    other = crd(names={"plural": "crontabs2", "kind": "CronTab", "singular": "crontab2", "listKind": "X"})
    other["metadata"]["name"] = "crontabs2.stable.example.com"
    st = names_plan(other, [c], [], "2026-01-01T00:00:00Z")
    conds = {x["type"]: x for x in st["conditions"]}
    assert (conds["NamesAccepted"]["status"], conds["NamesAccepted"]["reason"],
            conds["NamesAccepted"]["message"]) == ("False", "KindConflict", '"CronTab" is already in use')
    assert conds["Established"]["reason"] == "NotAccepted"
    # A built-in kind's names in the same group conflict too.
    apps = crd(group="apps", names={"plural": "deployments", "kind": "Dep2", "singular": "dep2",
                                    "listKind": "Dep2List"})
    st = names_plan(apps, [], list(default_registry().all()), "2026-01-01T00:00:00Z")
    assert {x["type"]: x for x in st["conditions"]}["NamesAccepted"]["reason"] == "PluralConflict"


def test_kinds_for_and_registrar() -> None:
    c = established(crd())
    c["spec"]["versions"][0]["additionalPrinterColumns"] = [
        {"name": "Image", "type": "string", "jsonPath": ".spec.image"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "priority": 1}]
    (info,) = kinds_for(c)
    assert (info.group, info.version, info.kind, info.plural, info.short_names) == (
        "stable.example.com", "v1", "CronTab", "crontabs", ("ct",))
    assert info.has_status and not info.strategic_merge
    assert [col.name for col in info.table_columns()] == ["Name", "Image", "Phase"]
    obj = {"apiVersion": "stable.example.com/v1", "kind": "CronTab", "metadata": {"name": "a", "namespace": "d"},
           "spec": {"image": "x", "bogus": 1}}
    assert info.prune_unknown is not None and info.prune_unknown(obj) == ["spec.bogus"]
    assert info.default is not None and info.validate is not None
    info.default(obj)
    assert obj["spec"]["replicas"] == 1
    obj["spec"]["replicas"] = 9
    assert [x["message"] for x in info.validate(obj, None)] == [
        "Invalid value: 9: spec.replicas in body should be less than or equal to 5"]
    reg = Registry()
    r = Registrar(reg)
    r.sync(c)
    assert reg.get("stable.example.com", "v1", "crontabs") is not None
    r.forget("crontabs.stable.example.com")
    assert reg.get("stable.example.com", "v1", "crontabs") is None


def test_columns_cells() -> None:
    cols = columns.table_columns([{"name": "Ready", "type": "string",
                                   "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
                                  {"name": "N", "type": "integer", "jsonPath": ".spec.n"},
                                  {"name": "Map", "type": "string", "jsonPath": ".spec.m"}])
    obj = {"metadata": {"name": "a"}, "spec": {"n": 3, "m": {"a": 1}},
           "status": {"conditions": [{"type": "X", "status": "False"}, {"type": "Ready", "status": "True"}]}}
    assert [c.value(obj) for c in cols] == ["a", "True", 3, '{"a":1}']
    assert cols[1].definition()["description"].startswith("Custom resource definition column")
    # No columns: kube's default Age column.
    assert [c.name for c in columns.table_columns([])] == ["Name", "Age"]
    assert columns.table_columns([{"name": "N", "type": "integer", "jsonPath": ".spec.n"}])[1].value(
        {"spec": {"n": "x"}}) is None


def test_two_versions_convert_none_and_webhook() -> None:
    c = crd()
    v1 = c["spec"]["versions"][0]
    c["spec"]["versions"] = [{**copy.deepcopy(v1), "name": "v1beta1", "storage": False}, v1]
    c = established(c)
    beta, ga = kinds_for(c)
    assert beta.storage_api_version == "stable.example.com/v1" and ga.storage_api_version == "stable.example.com/v1"
    obj = {"apiVersion": "stable.example.com/v1", "kind": "CronTab", "metadata": {"name": "a"}}

    async def main() -> None:
        out = await crd_conversion.convert(c, [obj], "stable.example.com/v1beta1")
        assert out[0]["apiVersion"] == "stable.example.com/v1beta1" and obj["apiVersion"] == "stable.example.com/v1"
        hook = copy.deepcopy(c)
        hook["spec"]["conversion"] = {"strategy": "Webhook"}
        try:
            await crd_conversion.convert(hook, [obj], "stable.example.com/v1beta1")
        except crd_conversion.WebhookConversionUnavailable as e:
            assert e.code == 500
        else:
            raise AssertionError("webhook conversion must not pass silently")
        # Nothing to convert: no webhook call either.
        assert await crd_conversion.convert(hook, [obj], "stable.example.com/v1") == [obj]

    trio.run(main)


def test_discovery_group_version_with_scale_subresource() -> None:
    """A kind whose last subresource is `scale` (autoscaling/v1 Scale) keeps its list's groupVersion
    (it once became autoscaling/v1, and clients listed the kind there: 404)."""
    from fleet.server.discovery import api_resource_list

    c = established(crd())
    c["spec"]["versions"][0]["subresources"]["scale"] = {"specReplicasPath": ".spec.replicas",
                                                         "statusReplicasPath": ".status.replicas"}
    reg = Registry()
    Registrar(reg).sync(c)
    doc = api_resource_list(reg, "stable.example.com", "v1")
    assert doc is not None and doc["groupVersion"] == "stable.example.com/v1"
    scale = next(r for r in doc["resources"] if r["name"] == "crontabs/scale")
    assert (scale["group"], scale["version"], scale["kind"]) == ("autoscaling", "v1", "Scale")


def test_status_subresource_restricts_root_keywords() -> None:
    c = crd()
    c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["anyOf"] = [{"required": ["spec"]}]
    got = messages(c)
    assert any(m.startswith("spec.versions[0].schema.openAPIV3Schema: Invalid value: ") and
               m.endswith("fields are allowed at the root of the schema if the status subresource is enabled")
               for m in got), got
    del c["spec"]["versions"][0]["subresources"]
    assert not any("at the root of the schema" in m for m in messages(c))


def test_registrar_keeps_entries_for_the_same_revision() -> None:
    c = established(crd())
    c["metadata"]["resourceVersion"] = "5"
    reg = Registry()
    r = Registrar(reg)
    r.sync(c)
    first = reg.get("stable.example.com", "v1", "crontabs")
    r.sync(copy.deepcopy(c))
    assert reg.get("stable.example.com", "v1", "crontabs") is first
    c["metadata"]["resourceVersion"] = "6"
    c["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    r.sync(c)
    info = reg.get("stable.example.com", "v1", "crontabs")
    assert info is not first and info is not None and "create" not in info.verbs
