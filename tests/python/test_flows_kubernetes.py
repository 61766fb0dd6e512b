"""The Kubernetes StatefulSet of flows/kubernetes, validated against the Kubernetes API's schema
(kubernetes-validate, strict: an unknown or misspelled field is an error). What its pods run is
run against the test server by tests/integration_scale_out.rs."""

import copy
import pathlib

import kubernetes_validate
import pytest
import yaml

MANIFEST = pathlib.Path(__file__).resolve().parents[2] / "flows" / "kubernetes" / "handoff-statefulset.yaml"
VERSION = kubernetes_validate.utils.latest_version()


def documents():
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def test_the_statefulset_is_valid_against_the_kubernetes_schema():
    found = documents()
    assert [d["kind"] for d in found] == ["StatefulSet"]
    for document in found:
        kubernetes_validate.validate(document, VERSION, strict=True)


def test_the_validator_refuses_a_misspelled_field():
    broken = copy.deepcopy(documents()[0])
    probe = broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    probe["httpGett"] = probe.pop("httpGet")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSION, strict=True)
