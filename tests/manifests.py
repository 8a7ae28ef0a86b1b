"""The Kubernetes manifests as deployed: deploy/kubernetes rendered as kustomize renders it, the
YAML it is written in, a workload's containers, and the sidecar container's environment."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.processes import ROOT

KUBERNETES = ROOT / "deploy" / "kubernetes"


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def kustomize_build(directory: Path) -> list[dict[str, Any]]:
    """Render a kustomization the way `kubectl kustomize` does, for the features used in deploy/.

    Handles `resources` (files and directories with their own kustomization), `configMapGenerator`
    with `files` and `options`, and `images`. Anything else fails, so a new feature in the
    kustomization is noticed here instead of being silently ignored.
    """
    kustomization = load_yaml(directory / "kustomization.yaml")
    known = {"apiVersion", "kind", "resources", "configMapGenerator", "images"}
    unknown = set(kustomization) - known
    assert not unknown, f"{directory}: kustomize features this test does not render: {unknown}"
    docs: list[dict[str, Any]] = []
    for resource in kustomization.get("resources", []):
        path = (directory / resource).resolve()
        docs.extend(kustomize_build(path) if path.is_dir() else yaml_docs(path))
    for generator in kustomization.get("configMapGenerator", []):
        options = generator.get("options", {})
        assert options.get("disableNameSuffixHash") is True, "name the ConfigMap predictably"
        metadata: dict[str, Any] = {"name": generator["name"]}
        if options.get("labels"):
            metadata["labels"] = dict(options["labels"])
        if options.get("annotations"):
            metadata["annotations"] = dict(options["annotations"])
        data = {}
        for file in generator["files"]:
            source = directory / file
            # kustomize refuses files outside the kustomization's root (LoadRestrictionsRootOnly).
            assert source.resolve().is_relative_to(directory.resolve()), file
            data[source.name] = source.read_text()
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data})
    images = {image["name"]: image for image in kustomization.get("images", [])}
    for doc in docs:
        for container in pod_containers(doc):
            name, _, _ = container["image"].partition(":")
            if name in images:
                image = images[name]
                container["image"] = f"{image.get('newName', name)}:{image['newTag']}"
    return docs


def pod_containers(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every container of a workload, init containers (native sidecars) included."""
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    yield from spec.get("initContainers", [])
    yield from spec.get("containers", [])


def manifest_env() -> dict[str, str]:
    """The sidecar container's environment as the Kubernetes Deployment sets it."""
    deployment = next(d for d in kustomize_build(KUBERNETES) if d["kind"] == "Deployment")
    sidecar = deployment["spec"]["template"]["spec"]["initContainers"][0]
    return {item["name"]: item["value"] for item in sidecar["env"] if "value" in item}
