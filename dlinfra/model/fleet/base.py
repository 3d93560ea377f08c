"""What every fleet model shares: the frozen, strict base class and the name type of fleet entries."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

Name = Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,22}[a-z0-9]$")]
"""Lower-case DNS-label-like name used in logical and physical names (2 to 24 characters)."""


class Strict(BaseModel):
    """Base of every fleet model: frozen, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)
