"""mkdocs hooks of ackkit's documentation site (mkdocs.yml ``hooks:``).

The site works opened from disk (``site/index.html``, file://): there a page may not
fetch ``search/search_index.json``, and the theme's search, on file://, loads
``search/search_index.js`` (``var __index = {...}``) instead; this writes that file
after the build. docs/javascripts/worker-from-disk.js runs the search's worker there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def on_post_build(config: Any, **kwargs: Any) -> None:
    search = Path(config["site_dir"]) / "search"
    index = search / "search_index.json"
    if index.is_file():
        text = index.read_text(encoding="utf-8")
        (search / "search_index.js").write_text(f"var __index = {text}", encoding="utf-8")
