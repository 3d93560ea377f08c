"""Standard images in the fleet: references must be pinned and well formed, the default must be one of them, and each
problem is one FleetError naming the file and key. Source of the reference grammar: distribution/reference."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dlinfra.model.fleet.images import FETCH_IMAGE, image_reference
from dlinfra.model.fleet.load import load_fleet

DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(
    "reference",
    [
        "nvcr.io/nvidia/pytorch:24.10-py3",
        "111122223333.dkr.ecr.us-west-2.amazonaws.com/dlinfra/train-pytorch:2026.11.1",
        f"111122223333.dkr.ecr.us-west-2.amazonaws.com/train@{DIGEST}",
        f"registry.lab.example:5000/team/train:v2@{DIGEST}",
        "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
        FETCH_IMAGE,
    ],
)
def test_pinned_references_pass(reference: str) -> None:
    assert image_reference(reference) == reference


@pytest.mark.parametrize(
    ("reference", "problem"),
    [
        ("nvcr.io/nvidia/pytorch", "is not pinned"),
        ("nvcr.io/nvidia/pytorch:latest", "is not pinned"),
        ("nvcr.io/nvidia/PyTorch:24.10-py3", "is not an image reference"),
        ("nvcr.io/nvidia/pytorch:24.10 py3", "is not an image reference"),
        ("nvcr.io/nvidia/pytorch@sha256:abc", "is not an image reference"),
        ("", "is not an image reference"),
    ],
)
def test_unpinned_or_malformed_references_are_refused(reference: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        image_reference(reference)


def _set(path: tuple[str, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return change


@pytest.mark.parametrize(
    ("change", "key", "message"),
    [
        (_set(("standard_images", "images", "pytorch", "image"), "nvcr.io/nvidia/pytorch:latest"),
         "standard_images.images.pytorch.image", "is not pinned"),
        (_set(("standard_images", "default"), "tensorflow"), "standard_images", "default: 'tensorflow' is not one of"),
        (_set(("standard_images", "images"), {}), "standard_images.images", "at least 1 item"),
        (_set(("standard_images", "max_code_mib"), 0), "standard_images.max_code_mib", "greater than or equal to 1"),
        (_set(("standard_images", "fetch_image"), "amazon/aws-cli"), "standard_images.fetch_image", "is not pinned"),
        (_set(("standard_images", "images", "Bad_Name"), {"image": "a/b:1"}), "standard_images.images.Bad_Name", ""),
        (_set(("standard_images", "images", "pytorch", "cuda"), "12"), "standard_images.images.pytorch.cuda", ""),
    ],
)  # fmt: skip
def test_bad_standard_images_name_the_file_and_key(
    fleet_error: Callable[..., str], change: Any, key: str, message: str
) -> None:
    text = fleet_error(change)
    assert key in text and message in text, text


def test_image_order_changes_nothing(write_fleet: Callable[..., Path]) -> None:
    def reverse(data: dict[str, Any]) -> None:
        images = data["standard_images"]["images"]
        data["standard_images"]["images"] = dict(reversed(list(images.items())))

    assert load_fleet(write_fleet()).fleet == load_fleet(write_fleet(reverse)).fleet
