"""The lab's standard images: the container images `dlinfra run` runs a researcher's code in (docs/researchers.md).

A reference is pinned: by a tag other than `latest`, or by a digest, so that one name means one environment from the
day it is declared. Its shape follows the grammar of distribution/reference (registry host[:port], lower-case path
components, `:tag`, `@sha256:<64 hex>`), which is what the kubelet and containerd accept as an image name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pydantic import Field, field_validator, model_validator

from dlinfra.model.fleet.base import Name, Strict

# distribution/reference (reference.go): host is a domain or IP with an optional port; a path component is lower-case
# alphanumerics separated by '.', '_', '__' or '-'s; a tag is [\w][\w.-]{0,127}; a sha256 digest is 64 hex digits.
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?)"
_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    rf"(?:(?P<host>{_HOST})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?"
)
_REFERENCE_MAX = 255  # distribution/reference NameTotalLengthMax: the name (host and path) at most 255 characters
# The most code `dlinfra run` uploads when the fleet sets no limit: a working directory of source and configs, not
# data or checkpoints (which belong on EFS or S3, and would cost every run their upload).
DEFAULT_CODE_LIMIT_MIB = 100
# The most a run may upload: one PutObject takes at most 5 GB (S3 user guide, "Uploading objects"), and the Job's
# archive volume holds 6 GiB (dlinfra.model.run_job FETCH_VOLUME).
MAX_CODE_LIMIT_MIB = 5120
# The image whose AWS CLI fetches a run's code from S3: 2.15.0 or later reads EKS Pod Identity credentials (EKS user
# guide, "Use pod identity with the AWS SDK"). A fleet whose nodes cannot reach public.ecr.aws names its own copy.
FETCH_IMAGE = "public.ecr.aws/aws-cli/aws-cli:2.22.0"


def image_reference(v: str) -> str:
    """A container image reference pinned by a tag other than latest, or by a sha256 digest."""
    match = _REFERENCE.fullmatch(v)
    if match is None:
        raise ValueError(
            f"{v!r} is not an image reference: [registry/]path[:tag][@sha256:<64 hex digits>], path in lower case "
            "(e.g. 111122223333.dkr.ecr.us-west-2.amazonaws.com/train/pytorch:2.5.1-cuda12.4)"
        )
    name_length = len(v.partition("@")[0].rpartition(":")[0] if match["tag"] else v.partition("@")[0])
    if name_length > _REFERENCE_MAX:
        raise ValueError(f"{v[:40]}...: an image name is at most {_REFERENCE_MAX} characters")
    if match["digest"] is None and match["tag"] in (None, "latest"):
        raise ValueError(
            f"{v!r} is not pinned: give a version tag (not latest) or a digest (@sha256:...), so that the image a job "
            "ran in can be found again"
        )
    return v


class StandardImage(Strict):
    """One standard image: the reference, and what a researcher should know about it."""

    image: str  # pinned reference; must hold python3, tar, and tensorboard (the sidecar `dlinfra run` adds)
    notes: str = ""  # what is in it (framework, CUDA), shown by `dlinfra run --list-images`

    @field_validator("image")
    @classmethod
    def _pinned(cls, v: str) -> str:
        return image_reference(v)


class StandardImages(Strict):
    """The fleet's standard images (name -> image), which one `dlinfra run` uses by default, and its upload cap."""

    images: Mapping[Name, StandardImage] = Field(min_length=1)
    default: Name  # a name of `images`
    # The largest working directory `dlinfra run` uploads, in MiB of files packed (before compression); a run may
    # lower or raise it with --max-code-mib.
    max_code_mib: int = Field(DEFAULT_CODE_LIMIT_MIB, ge=1, le=MAX_CODE_LIMIT_MIB)
    fetch_image: str = FETCH_IMAGE  # pinned image with the AWS CLI (2.15.0 or later) and sh

    @field_validator("fetch_image")
    @classmethod
    def _fetch_pinned(cls, v: str) -> str:
        return image_reference(v)

    @model_validator(mode="after")
    def _default_known(self) -> StandardImages:
        if self.default not in self.images:
            raise ValueError(f"default: {self.default!r} is not one of images ({', '.join(sorted(self.images))})")
        return self

    @field_validator("images")
    @classmethod
    def _sorted(cls, v: Mapping[str, StandardImage]) -> Mapping[str, StandardImage]:
        return dict(sorted(v.items()))  # order in the file changes nothing declared
