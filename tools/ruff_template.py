"""Runs ruff (lint and format) on the template's Python sources, which are Jinja templates.

    python tools/ruff_template.py check     # what `make lint` does at the template root
    python tools/ruff_template.py format    # rewrites the template's .py files in ruff's style

A template file is not Python until cookiecutter renders it, so each file is made Python first:
every `{{ ... }}` expression becomes an identifier-safe token, and every `{%- ... %}` tag (alone on
its line) becomes a comment; ruff runs with the generated project's own settings (`[tool.ruff]`
of its pyproject.toml); then the tokens and tags are put back. A bake of the formatted template is
what `make lint` checks in the generated project.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "{{cookiecutter.project}}"
EXPRESSION = re.compile(r"\{\{.*?\}\}")
TAG_LINE = re.compile(r"^[ \t]*(\{%-?.*?-?%\})[ \t]*$")
TAG_COMMENT = re.compile(r"^[ \t]*# JINJA-TAG (.*)$")
PROJECT_DESCRIPTION = re.compile(r"^description = \{\{.*\}\}$", re.MULTILINE)


def to_python(text: str, path: Path) -> tuple[str, dict[str, str]]:
    tokens: dict[str, str] = {}

    def token(match: re.Match) -> str:
        # Same width as the rendered default where it matters most (the package name, 11 characters).
        name = f"JJ{len(tokens):02d}{'_' * 7}"
        tokens[name] = match.group(0)
        return name

    lines = []
    source = text.splitlines(keepends=True)
    for number, line in enumerate(source, 1):
        tag = TAG_LINE.match(line)
        if tag:
            # Indented like the code that follows, as ruff would place a comment there.
            following = next((later for later in source[number:] if later.strip() and not TAG_LINE.match(later)), "")
            indent = following[: len(following) - len(following.lstrip())]
            lines.append(f"{indent}# JINJA-TAG {tag.group(1)}\n")
        elif "{%" in line:
            sys.exit(f"{path}:{number}: put each {{% ... %}} tag on a line of its own (as {{%- ... %}})")
        else:
            lines.append(EXPRESSION.sub(token, line))
    return "".join(lines), tokens


def from_python(text: str, tokens: dict[str, str]) -> str:
    lines = [TAG_COMMENT.sub(r"\1", line) for line in text.splitlines(keepends=True)]
    text = "".join(lines)
    for name, original in tokens.items():
        text = text.replace(name, original)
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("check", "format"))
    parser.add_argument("--ruff", default="ruff")
    args = parser.parse_args(argv)
    sources = sorted(p for p in TEMPLATE.rglob("*.py") if "__pycache__" not in p.parts)
    with tempfile.TemporaryDirectory(prefix="ruff-template-") as scratch:
        scratch = Path(scratch)
        config = scratch / "pyproject.toml"
        config.write_text(PROJECT_DESCRIPTION.sub('description = "x"', (TEMPLATE / "pyproject.toml").read_text()))
        copies, tokens = {}, {}
        for source in sources:
            relative = source.relative_to(TEMPLATE)
            copy = scratch / "project" / Path(*(part.replace("{{cookiecutter.package}}", "pkg") for part in relative.parts))
            copy.parent.mkdir(parents=True, exist_ok=True)
            text, tokens[source] = to_python(source.read_text(), relative)
            copy.write_text(text)
            copies[source] = copy
        ruff = [args.ruff, "--config", str(config)]
        project = str(scratch / "project")
        if args.mode == "format":
            subprocess.run([*ruff, "check", "--fix", "--quiet", project], check=False)
            subprocess.run([*ruff, "format", "--quiet", project], check=True)
            changed = 0
            for source, copy in copies.items():
                text = from_python(copy.read_text(), tokens[source])
                if text != source.read_text():
                    source.write_text(text)
                    changed += 1
            print(f"{changed} of {len(sources)} template files reformatted")
            return 0
        status = subprocess.run([*ruff, "check", project]).returncode
        status |= subprocess.run([*ruff, "format", "--check", project]).returncode
        return status


if __name__ == "__main__":
    sys.exit(main())
