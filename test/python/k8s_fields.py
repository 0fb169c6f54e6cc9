"""The fields a manifest in examples/k8s may use, written down from the CRDs
(PyTorchJob kubeflow.org/v1 of training-operator 1.9; TrainJob
trainer.kubeflow.org/v1alpha1 of Kubeflow Trainer) and from the Kubernetes
core types they embed, and a check that walks a manifest against them: a
misspelt or misplaced field is named with its path. A schema is a dict (an
object: its fields), a one-element list (an array of that), a type, ANY, or
a set (one of these strings)."""

from __future__ import annotations

from typing import Any

ANY = object()

ENV_VAR = {"name": str, "value": str, "valueFrom": ANY}
VOLUME_MOUNT = {"name": str, "mountPath": str, "readOnly": bool, "subPath": str,
                "subPathExpr": str, "mountPropagation": str, "recursiveReadOnly": str}
RESOURCES = {"limits": ANY, "requests": ANY, "claims": ANY}
CONTAINER = {
    "name": str, "image": str, "command": [str], "args": [str], "workingDir": str,
    "ports": [{"name": str, "containerPort": int, "protocol": str, "hostPort": int, "hostIP": str}],
    "envFrom": [ANY], "env": [ENV_VAR], "resources": RESOURCES, "resizePolicy": [ANY],
    "restartPolicy": str, "volumeMounts": [VOLUME_MOUNT], "volumeDevices": [ANY],
    "livenessProbe": ANY, "readinessProbe": ANY, "startupProbe": ANY, "lifecycle": ANY,
    "terminationMessagePath": str, "terminationMessagePolicy": str, "imagePullPolicy": str,
    "securityContext": ANY, "stdin": bool, "stdinOnce": bool, "tty": bool,
}
TOLERATION = {"key": str, "operator": {"Exists", "Equal"}, "value": str, "effect": str,
              "tolerationSeconds": int}
VOLUME = {"name": str, "emptyDir": {"medium": str, "sizeLimit": ANY}, "persistentVolumeClaim": ANY,
          "configMap": ANY, "secret": ANY, "hostPath": ANY, "nfs": ANY, "csi": ANY,
          "projected": ANY, "downwardAPI": ANY, "ephemeral": ANY}
POD_SPEC = {
    "containers": [CONTAINER], "initContainers": [CONTAINER], "volumes": [VOLUME],
    "restartPolicy": str, "terminationGracePeriodSeconds": int, "activeDeadlineSeconds": int,
    "dnsPolicy": str, "nodeSelector": ANY, "serviceAccountName": str, "serviceAccount": str,
    "automountServiceAccountToken": bool, "nodeName": str, "hostNetwork": bool, "hostPID": bool,
    "hostIPC": bool, "shareProcessNamespace": bool, "securityContext": ANY,
    "imagePullSecrets": [ANY], "hostname": str, "subdomain": str, "affinity": ANY,
    "schedulerName": str, "tolerations": [TOLERATION], "hostAliases": [ANY],
    "priorityClassName": str, "priority": int, "dnsConfig": ANY, "readinessGates": [ANY],
    "runtimeClassName": str, "enableServiceLinks": bool, "preemptionPolicy": str, "overhead": ANY,
    "topologySpreadConstraints": [ANY], "setHostnameAsFQDN": bool, "os": ANY, "hostUsers": bool,
    "schedulingGates": [ANY], "resourceClaims": [ANY], "ephemeralContainers": [ANY],
}
METADATA = {"name": str, "namespace": str, "labels": ANY, "annotations": ANY,
            "generateName": str}
POD_TEMPLATE = {"metadata": METADATA, "spec": POD_SPEC}

REPLICA_SPEC = {"replicas": int, "restartPolicy": {"Always", "OnFailure", "Never", "ExitCode"},
                "template": POD_TEMPLATE}
PYTORCHJOB = {
    "apiVersion": {"kubeflow.org/v1"}, "kind": {"PyTorchJob"}, "metadata": METADATA,
    "spec": {
        "pytorchReplicaSpecs": {"Master": REPLICA_SPEC, "Worker": REPLICA_SPEC},
        "nprocPerNode": str,
        "elasticPolicy": {"minReplicas": int, "maxReplicas": int, "maxRestarts": int,
                          "nProcPerNode": int, "rdzvBackend": str, "rdzvHost": str, "rdzvId": str,
                          "rdzvPort": int, "rdzvConf": [{"key": str, "value": str}],
                          "standalone": bool, "metrics": [ANY]},
        "runPolicy": {"cleanPodPolicy": str, "backoffLimit": int, "activeDeadlineSeconds": int,
                      "ttlSecondsAfterFinished": int, "suspend": bool, "schedulingPolicy": ANY},
    },
}
CONTAINER_OVERRIDE = {"name": str, "command": [str], "args": [str], "env": [ENV_VAR],
                      "envFrom": [ANY], "volumeMounts": [VOLUME_MOUNT]}
TRAINJOB = {
    "apiVersion": {"trainer.kubeflow.org/v1alpha1"}, "kind": {"TrainJob"}, "metadata": METADATA,
    "spec": {
        "runtimeRef": {"name": str, "apiGroup": str, "kind": {"ClusterTrainingRuntime", "TrainingRuntime"}},
        "trainer": {"image": str, "command": [str], "args": [str], "env": [ENV_VAR],
                    "numNodes": int, "numProcPerNode": ANY, "resourcesPerNode": RESOURCES},
        "podSpecOverrides": [{"targetJobs": [{"name": str}], "containers": [CONTAINER_OVERRIDE],
                              "initContainers": [CONTAINER_OVERRIDE], "volumes": [VOLUME],
                              "nodeSelector": ANY, "serviceAccountName": str,
                              "tolerations": [TOLERATION]}],
        "labels": ANY, "annotations": ANY, "suspend": bool, "managedBy": str,
        "datasetConfig": ANY, "modelConfig": ANY,
    },
}
# core kinds the examples use beside the jobs: their own fields are not checked below the top
CORE = {"apiVersion": str, "kind": str, "metadata": METADATA, "spec": ANY, "data": ANY,
        "stringData": ANY, "type": str}
REQUIRED = {"PyTorchJob": [("spec", "pytorchReplicaSpecs")], "TrainJob": [("spec", "runtimeRef", "name")]}


def schema_for(doc: dict[str, Any]) -> Any:
    return {"PyTorchJob": PYTORCHJOB, "TrainJob": TRAINJOB}.get(str(doc.get("kind")), CORE)


def check(value: Any, schema: Any, path: str = "") -> list[str]:
    """The problems of value against schema, each with its path."""
    if schema is ANY:
        return []
    if isinstance(schema, set):
        return [] if value in schema else [f"{path}: {value!r} is not one of {sorted(schema)}"]
    if isinstance(schema, type):
        ok = isinstance(value, schema) and not (schema is int and isinstance(value, bool))
        return [] if ok else [f"{path}: {value!r} is not {schema.__name__}"]
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{path}: not a list"]
        return [p for i, v in enumerate(value) for p in check(v, schema[0], f"{path}[{i}]")]
    if not isinstance(value, dict):
        return [f"{path}: not a mapping"]
    out = []
    for k, v in value.items():
        if k not in schema:
            out.append(f"{path}.{k}: no such field here (fields: {', '.join(sorted(schema))})")
        else:
            out += check(v, schema[k], f"{path}.{k}")
    return out


def check_manifest(doc: dict[str, Any]) -> list[str]:
    problems = check(doc, schema_for(doc), str(doc.get("kind", "?")))
    for req in REQUIRED.get(str(doc.get("kind")), []):
        node: Any = doc
        for k in req:
            node = node.get(k) if isinstance(node, dict) else None
        if node is None:
            problems.append(f"{doc.get('kind')}.{'.'.join(req)}: required")
    return problems
