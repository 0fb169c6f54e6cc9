"""Every manifest in examples/k8s uses only fields the CRDs (PyTorchJob
kubeflow.org/v1, TrainJob trainer.kubeflow.org/v1alpha1) and the core types
they embed have (k8s_fields.py), so a misspelt field fails here instead of in
a user's cluster; and the examples say what the docs say they say."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from k8s_fields import check_manifest  # noqa: E402

EXAMPLES = HERE.parents[1] / "examples" / "k8s"


def manifests() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for p in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(p.read_text()):
            if doc is not None:
                out.append((p.name, doc))
    return out


def by_name(name: str) -> dict[str, Any]:
    return [d for f, d in manifests() if d.get("metadata", {}).get("name") == name][0]


def test_every_example_uses_only_the_fields_its_kind_has() -> None:
    seen = manifests()
    assert {d["kind"] for _, d in seen} >= {"PyTorchJob", "TrainJob"}, [d["kind"] for _, d in seen]
    problems = [f"{f}: {p}" for f, d in seen for p in check_manifest(d)]
    assert not problems, "\n".join(problems)


def test_a_misspelt_or_misplaced_field_is_named_with_its_path() -> None:
    job = copy.deepcopy(by_name("llm-training"))  # pytorchjob-static.yaml
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replica"] = 3
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    job["spec"]["pytorchReplicaSpecs"]["Launcher"] = {}
    probs = "\n".join(check_manifest(job))
    assert "PyTorchJob.spec.pytorchReplicaSpecs.Worker.replica: no such field" in probs, probs
    assert "containers[0].volumeMount: no such field" in probs, probs
    assert "pytorchReplicaSpecs.Launcher: no such field" in probs, probs
    el = copy.deepcopy(by_name("llm-elastic"))
    el["spec"]["elasticPolicy"]["rdzvPorts"] = 29400
    el["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] = "OnExitCode"
    probs = "\n".join(check_manifest(el))
    assert "elasticPolicy.rdzvPorts: no such field" in probs, probs
    assert "'OnExitCode' is not one of" in probs, probs
    tj = copy.deepcopy(by_name("llm-train"))  # trainjob.yaml
    tj["spec"]["trainer"]["numNode"] = 4
    tj["spec"]["podSpecOverrides"][0]["containers"][0]["volumeMount"] = []
    del tj["spec"]["runtimeRef"]["name"]
    probs = "\n".join(check_manifest(tj))
    assert "TrainJob.spec.trainer.numNode: no such field" in probs, probs
    assert "podSpecOverrides[0].containers[0].volumeMount: no such field" in probs, probs
    assert "TrainJob.spec.runtimeRef.name: required" in probs, probs


def command(doc: dict[str, Any]) -> list[str]:
    if doc["kind"] == "TrainJob":
        return list(doc["spec"]["trainer"]["command"])
    return list(doc["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"])


def test_the_examples_run_as_the_docs_say() -> None:
    # the elastic PyTorchJob without a server: the operator's variables, the program only
    el = by_name("llm-elastic")
    assert command(el) == ["gpulaunch", "train_llm.py"], command(el)
    assert el["spec"]["elasticPolicy"]["rdzvBackend"] == "c10d"
    # its variant against gpulaunch-rdzv names the server's Service
    srv = by_name("llm-elastic-srv")
    assert "gpulaunch-rdzv:29400" in command(srv), command(srv)
    # the TrainJob replaces torchrun with gpulaunch and mounts /dev/shm into the runtime's container
    tj = by_name("llm-train")
    assert command(tj)[0] == "gpulaunch" and tj["spec"]["runtimeRef"]["name"] == "torch-distributed"
    ov = tj["spec"]["podSpecOverrides"][0]
    assert any(m["mountPath"] == "/dev/shm" for c in ov["containers"] for m in c["volumeMounts"])
    # every job restarts on the retryable exit codes (143 after a preemption)
    for name in ("llm-training", "llm-elastic", "llm-elastic-srv"):
        for rs in by_name(name)["spec"]["pytorchReplicaSpecs"].values():
            assert rs["restartPolicy"] == "ExitCode", name
