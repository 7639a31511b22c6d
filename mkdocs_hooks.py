"""MkDocs hooks of the documentation site: anchors for the upstream NeMo Gym pages' own links.

The pages in `docs/spec/` are NeMo Gym's, kept byte for byte (`tests/test_spec_api.py` reads them).
They link to anchors such as `#nemo_gym-core-failure_kinds-FailureClass`, which their original site
generated from each documented object; a Markdown copy has none, so every such link would be broken
(and `mkdocs build --strict` refuses broken anchors). At build time, before each code block that
declares an object (`class nemo_gym.core.failure_kinds.FailureClass`, `nemo_gym.core.x.NAME = ...`),
this hook inserts the anchor its page links to. The files themselves are never changed.
"""

from __future__ import annotations

import re
from typing import Any

_DECLARATION = re.compile(r"^(?:async def |def |class )?(nemo_gym(?:\.\w+)+)")
_FENCE = "```"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if not page.file.src_uri.startswith("spec/"):
        return markdown
    lines = markdown.split("\n")
    output: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith(_FENCE) and index + 1 < len(lines):
            declared = _DECLARATION.match(lines[index + 1])
            if declared is not None:
                output.extend([f'<a id="{declared.group(1).replace(".", "-")}"></a>', ""])
            closing = (j for j in range(index + 1, len(lines)) if lines[j].startswith(_FENCE))
            end = next(closing, len(lines) - 1)
            output.extend(lines[index : end + 1])
            index = end + 1
            continue
        output.append(line)
        index += 1
    return "\n".join(output)
