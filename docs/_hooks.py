"""mkdocs hooks: the docstrings use Sphinx roles (``:class:`Store```); the API
reference shows the name alone, as code."""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:class|meth|func|mod|attr|exc|data|obj):(?=<code>)")


def on_page_content(html: str, **_: Any) -> str:
    return ROLE.sub("", html)
