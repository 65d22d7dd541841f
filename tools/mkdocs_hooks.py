"""MkDocs hooks: the README is the site's home page and the CHANGELOG one of its pages.

Both live at the repository's root, where GitHub shows them, and link into ``docs/``; the pages
in ``docs/`` link back to them as ``../README.md``. These hooks add the two files to the site
(as ``index.md`` and ``changelog.md``) and rewrite every relative link by where its target lies
in the repository, so the same links work on GitHub and in the site, and ``mkdocs build
--strict`` still validates every one of them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
ROOT_PAGES = {"README.md": "index.md", "CHANGELOG.md": "changelog.md"}
LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")


def on_files(files, config):
    """Add the root pages to the site."""
    for source, dest in ROOT_PAGES.items():
        files.append(File.generated(config, dest, abs_src_path=str(ROOT / source)))
    return files


def _site_path(repo_path: Path, docs: Path) -> Path | None:
    """Where a repository file is in the site (relative to docs_dir), or None when outside it."""
    for source, dest in ROOT_PAGES.items():
        if repo_path == ROOT / source:
            return Path(dest)
    try:
        return repo_path.relative_to(docs)
    except ValueError:
        return None


def on_page_markdown(markdown, page, config, files):
    """Rewrite relative links from where the page's source lies to where its target lies."""
    docs = Path(config["docs_dir"]).resolve()
    here = Path(page.file.src_uri)
    real = next((ROOT / s for s, d in ROOT_PAGES.items() if d == page.file.src_uri),
                docs / here)

    def rewrite(match: re.Match) -> str:
        target = match.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            return match.group(0)
        site = _site_path((real.parent / target).resolve(), docs)
        if site is None:
            return match.group(0)  # left as is: mkdocs reports it
        new = os.path.relpath(site, here.parent).replace(os.sep, "/")
        return f"{match.group(1)}{new}{match.group(3) or ''}{match.group(4)}"

    return LINK.sub(rewrite, markdown)
