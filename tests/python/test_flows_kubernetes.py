"""The Kubernetes example (flows/kubernetes/handoff-statefulset.yaml) against the Kubernetes API's
own schema, strictly (no field the API does not know), with kubernetes-validate's bundled OpenAPI
schema of the newest Kubernetes it holds. What the manifest runs is run against the test server by
tests/integration_scale_out.rs."""

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

MANIFEST = Path(__file__).resolve().parents[2] / "flows" / "kubernetes" / "handoff-statefulset.yaml"
VERSION = kubernetes_validate.utils.latest_version()


def documents():
    with MANIFEST.open() as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def test_every_document_of_the_manifest_is_valid_for_the_kubernetes_api():
    kinds = []
    for document in documents():
        kubernetes_validate.validate(document, VERSION, strict=True)
        kinds.append(document["kind"])
    assert sorted(kinds) == ["Service", "StatefulSet"]


@pytest.mark.parametrize(
    "mistake",
    [
        lambda c: c["readinessProbe"]["httpGet"].update(prot=9464),
        lambda c: c.update(ports=[{"name": "metrics", "containerPort": "9464"}]),
        lambda c: c["env"].append({"name": "X", "valueFrom": {"secretRef": {"name": "s"}}}),
    ],
    ids=["unknown-field", "port-as-string", "unknown-env-source"],
)
def test_the_validator_refuses_a_manifest_with_a_mistake(mistake):
    (set_,) = [d for d in documents() if d["kind"] == "StatefulSet"]
    broken = copy.deepcopy(set_)
    mistake(broken["spec"]["template"]["spec"]["containers"][0])
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSION, strict=True)
