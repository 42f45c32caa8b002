"""ops/docker/Dockerfile agrees with what the manifests and pyproject.toml expect of the image.

No Docker daemon runs on the test machines, so the build itself is not exercised here; these checks
catch the drift that would break it or the pods that run it.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.integration.test_ops_k8s import OVERLAYS, render

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "ops" / "docker" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_the_image_runs_as_the_user_the_manifests_run_as() -> None:
    users = [args for word, args in instructions() if word == "USER"]
    assert users == ["10001:10001"]
    for overlay in OVERLAYS:
        for obj in render(overlay):
            spec = obj.get("spec", {}).get("template", {}).get("spec")
            if spec and "securityContext" in spec:
                ctx = spec["securityContext"]
                assert (ctx["runAsUser"], ctx["runAsGroup"]) == (10001, 10001), obj["metadata"]["name"]


def test_every_copied_path_exists_and_is_not_ignored() -> None:
    ignored = {
        line.strip()
        for line in (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for word, args in instructions():
        if word == "COPY" and not args.startswith("--from"):
            *sources, _ = args.split()
            for src in sources:
                assert (ROOT / src).exists(), f"COPY {src}: no such path in the repository"
                assert src.split("/")[0] not in ignored, f"COPY {src} but the .dockerignore drops it"


def test_the_install_uses_the_pinned_torch_and_extras_that_exist() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    text = DOCKERFILE.read_text()
    (torch_pin,) = [d for d in project["dependencies"] if d.startswith("torch")]
    assert f"{torch_pin} " in text or f"{torch_pin}\n" in text, (
        "the CPU variant must install the pinned torch"
    )
    for extra in re.findall(r'-e "\.\[(\w+)\]"', text):
        assert extra in project["optional-dependencies"], extra
    assert set(re.findall(r'-e "\.\[(\w+)\]"', text)) == {"cpu", "gpu"}


@pytest.mark.parametrize("overlay", list(OVERLAYS))
def test_the_documented_build_tags_are_the_images_the_overlays_run(overlay: str) -> None:
    header = "\n".join(line for line in DOCKERFILE.read_text().splitlines() if line.startswith("#"))
    images = {
        c["image"]
        for obj in render(overlay)
        for c in obj.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
    }
    assert images, overlay
    assert len(images) == 1, f"{overlay} mixes images: {images}"
    for image in images:
        assert f"-t {image} ." in header, f"{image} has no build command in the Dockerfile's header"


def test_the_environment_matches_the_manifests_writable_paths() -> None:
    env = " ".join(args for word, args in instructions() if word == "ENV")
    for var in (
        "HOME=/cache",
        "XDG_CACHE_HOME=/cache",
        "HF_HOME=/cache/huggingface",
        "VLLM_CACHE_ROOT=/cache/vllm",
    ):
        assert var in env, var
    kustomization = (ROOT / "ops" / "k8s" / "base" / "kustomization.yaml").read_text()
    for var in ("HOME=/cache", "HF_HOME=/cache/huggingface", "VLLM_CACHE_ROOT=/cache/vllm"):
        assert var in kustomization, var
