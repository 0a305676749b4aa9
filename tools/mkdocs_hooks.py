"""mkdocs hooks (mkdocs.yml `hooks:`): the docs site's HTTP API reference, rendered by Redoc
from the OpenAPI document the code builds, at `reference/api/` of the built site.

The build gets, as generated files under `reference/api/`, the gateway's own `/docs` page
(`gateway/docs_assets/docs.html`), the Redoc bundle the package ships, and `openapi.json`: the
document a gateway with default limits, the HTTP receivers and the shipped `bandgate.toml`
serves. Nothing is copied into docs/, so the page cannot drift from the code, and nothing is
loaded from a CDN.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
API_DIR = Path("reference") / "api"


def served_document() -> dict[str, Any]:
    """What `GET /openapi.json` answers for the shipped topology, default settings and the
    HTTP receivers (as `gateway.routes.openapi` builds it)."""
    from bandgate.gateway.openapi import ApiLimits, openapi_document
    from bandgate.pull.app import PullExtension
    from bandgate.pull.settings import PullSettings
    from bandgate.topology.loader import load_topology

    topology = load_topology(ROOT / "bandgate.toml")
    limits = ApiLimits(max_delay_seconds=topology.ladder.max_delay_ms / 1000)
    document = copy.deepcopy(openapi_document(limits))
    PullExtension(PullSettings()).document(document)
    return document


def api_reference_files() -> dict[str, bytes]:
    """The site's files of the rendered reference, by their path in the site."""
    from bandgate.gateway.api_docs import BUNDLE, asset

    files = {
        "index.html": asset("docs.html"),
        f"docs/{BUNDLE}": asset(BUNDLE),
        "openapi.json": json.dumps(served_document(), indent=1).encode(),
    }
    for notice in ("redoc.standalone.js.LICENSE.txt", "REDOC-LICENSE.txt"):
        files[f"docs/{notice}"] = asset(notice)
    return {f"{API_DIR.as_posix()}/{name}": content for name, content in files.items()}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the rendered reference as files of the site (generated, never written to docs/), so
    that pages link to it as to any other file and a broken link fails the strict build."""
    for path, content in api_reference_files().items():
        files.append(File.generated(config, path, content=content))
    return files
