"""fleet.api.podrefs: the Secrets, ConfigMaps and claims a pod or volume names."""

from __future__ import annotations

from fleet.api.podrefs import (
    is_mirror_pod,
    pod_configmap_names,
    pod_pvc_names,
    pod_resource_claim_names,
    pod_secret_names,
    pv_kubelet_secret_refs,
)


def test_secret_names_from_every_place() -> None:
    pod = {"metadata": {"name": "p"}, "spec": {
        "imagePullSecrets": [{"name": "pull"}, {}],
        "initContainers": [{"envFrom": [{"secretRef": {"name": "init"}}]}],
        "containers": [{"env": [{"name": "a", "valueFrom": {"secretKeyRef": {"name": "env"}}},
                                {"name": "b", "value": "x"}]}],
        "ephemeralContainers": [{"envFrom": [{"secretRef": {"name": "debug"}}]}],
        "volumes": [{"name": "s", "secret": {"secretName": "vol"}},
                    {"name": "p", "projected": {"sources": [{"secret": {"name": "proj"}}, {"downwardAPI": {}}]}},
                    {"name": "r", "rbd": {"secretRef": {"name": "rbd"}}},
                    {"name": "af", "azureFile": {"secretName": "azure"}},
                    {"name": "c", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "csi"}}}]}}
    assert pod_secret_names(pod) == {"pull", "init", "env", "debug", "vol", "proj", "rbd", "azure", "csi"}
    assert pod_configmap_names(pod) == set()


def test_configmap_names() -> None:
    pod = {"spec": {"containers": [{"envFrom": [{"configMapRef": {"name": "a"}}],
                                    "env": [{"valueFrom": {"configMapKeyRef": {"name": "b"}}}]}],
                    "volumes": [{"configMap": {"name": "c"}},
                                {"projected": {"sources": [{"configMap": {"name": "d"}}]}}]}}
    assert pod_configmap_names(pod) == {"a", "b", "c", "d"}


def test_claims_and_resource_claims() -> None:
    pod = {"metadata": {"name": "web"},
           "spec": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "db"}},
                                {"name": "tmp", "ephemeral": {"volumeClaimTemplate": {}}}],
                    "resourceClaims": [{"name": "a", "resourceClaimName": "direct"},
                                       {"name": "b", "resourceClaimTemplateName": "t"},
                                       {"name": "c", "resourceClaimTemplateName": "t"}]},
           "status": {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "web-b-x"}]}}
    assert pod_pvc_names(pod) == {"db", "web-tmp"}
    assert pod_resource_claim_names(pod) == {"direct", "web-b-x"}


def test_malformed_pods_name_nothing() -> None:
    for bad in ({}, {"spec": 3}, {"spec": {"volumes": 5, "containers": "x", "imagePullSecrets": {"a": 1}}},
                {"spec": {"containers": [{"env": [3, {"valueFrom": []}]}], "volumes": [None, {"secret": 1}]}}):
        assert pod_secret_names(bad) == set()
        assert pod_configmap_names(bad) == set()
        assert pod_pvc_names(bad) == set()
        assert pod_resource_claim_names(bad) == set()


def test_pv_secrets_the_kubelet_reads() -> None:
    pv = {"spec": {"claimRef": {"namespace": "apps", "name": "c"},
                   "csi": {"nodeStageSecretRef": {"name": "stage", "namespace": "storage"},
                           "nodePublishSecretRef": {"name": "publish"},
                           "controllerPublishSecretRef": {"name": "ctl", "namespace": "storage"}},
                   "iscsi": {"secretRef": {"name": "chap"}}}}
    assert pv_kubelet_secret_refs(pv) == {("storage", "stage"), ("apps", "publish"), ("apps", "chap")}


def test_mirror_pod() -> None:
    assert is_mirror_pod({"metadata": {"annotations": {"kubernetes.io/config.mirror": ""}}})
    assert not is_mirror_pod({"metadata": {"annotations": None}})
