"""The jinja2 environment the site gateway's files render from (dlinfra/render/templates), and their format version."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Final

import jinja2

# Bumped whenever the rendered files change shape, so a gateway's file says which generator wrote it.
# 2: route-based tunnels (XFRM interfaces), charon retransmission settings, sysctl and nftables files.
# 3: the XFRM script refuses link-local traffic no tunnel carries (an unreachable route for 169.254.0.0/16).
FORMAT_VERSION: Final = 3


@functools.cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # config files, not HTML; inputs are validated instead
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render_template(template: str, **context: Any) -> str:
    """One gateway file from its template; its header states FORMAT_VERSION."""
    return _environment().get_template(template).render(format_version=FORMAT_VERSION, **context)
