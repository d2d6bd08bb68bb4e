"""mkdocs hook: the reference pages, generated from the code at each build (nothing generated is kept in git).

- reference/cli.md: every `singerlake` command and option, from the command's own argument parser;
- reference/settings.md: every setting of the target, the tap and the Meltano utility, from their schemas;
- reference/spec.md: the lake format, shared/SPEC.md, each section anchored as #s<N> (§N).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import yaml
from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[1]


def on_files(files, config):
    for name, build in (("cli.md", cli_page), ("settings.md", settings_page), ("spec.md", spec_page)):
        files.append(File.generated(config, f"reference/{name}", content=build()))
    return files


def cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


# -- the command line ------------------------------------------------------------------------------
def cli_page() -> str:
    from singerlake.cli.main import parser

    main = parser()
    (commands,) = [action for action in main._actions if isinstance(action, argparse._SubParsersAction)]
    lines = [
        "# `singerlake` command reference",
        "",
        "Generated from the command's own parser. Every command but `spark` takes the lake root first; `singerlake COMMAND --help`",
        "prints the same. Exit codes: 0 success, 1 some streams or files failed (the others finished) or `verify`",
        "found problems, 2 a usage or configuration error (one line on stderr; `--debug` adds the traceback).",
        "",
    ]
    seen = set()
    for name, sub in commands.choices.items():
        if id(sub) in seen:
            continue  # an alias
        seen.add(id(sub))
        lines += [f"## {name}", "", cell(sub.description or ""), "", "```text", sub.format_usage().strip(), "```", ""]
        lines += ["| argument | help | default |", "|---|---|---|"]
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            flags = ", ".join(f"`{flag}`" for flag in action.option_strings) or f"`{action.metavar or action.dest}`"
            if action.metavar and action.option_strings:
                flags += f" `{action.metavar}`"
            default = action.default if action.default not in (None, False, [], argparse.SUPPRESS) else ""
            choices = f" (one of: {', '.join(map(str, action.choices))})" if action.choices else ""
            lines.append(f"| {flags} | {cell(action.help or '')}{cell(choices)} | {cell(default)} |")
        lines.append("")
    return "\n".join(lines)


# -- settings --------------------------------------------------------------------------------------
def settings_page() -> str:
    from tap_singerlake.tap import TapSingerlake
    from target_singerlake.target import TargetSingerlake

    lines = [
        "# Settings reference",
        "",
        "Generated from the plugins' own setting schemas (`--about` prints the same) and the utility's Hub definition.",
        "Settings marked secret are never logged. The lake settings (`lake_root`, `s3_*`) may instead be set once",
        "for all three as environment variables `SINGERLAKE_LAKE_ROOT`, `SINGERLAKE_S3_ENDPOINT_URL` and so on;",
        "a plugin's own setting wins. Both plugins also take the Meltano SDK's standard settings (stream maps,",
        "flattening, batch configuration: `--about` lists them).",
        "",
    ]
    for title, plugin in (("target-singerlake (loader)", TargetSingerlake), ("tap-singerlake (extractor)", TapSingerlake)):
        lines += [f"## {title}", "", "| setting | type | secret | default | description |", "|---|---|---|---|---|"]
        for name, prop in plugin.declared_settings.to_dict()["properties"].items():
            kinds = [prop["type"]] if isinstance(prop.get("type"), str) else [t for t in prop.get("type", []) if t != "null"]
            kind = "/".join(kinds) + (f" ({', '.join(map(str, prop['enum']))})" if "enum" in prop else "")
            default = json.dumps(prop["default"]) if "default" in prop else ""
            secret = "yes" if prop.get("secret") else ""
            lines.append(f"| `{name}` | {cell(kind)} | {secret} | {cell(default)} | {cell(prop.get('description', ''))} |")
        lines.append("")
    utility = yaml.safe_load((REPO / "hub/utilities/singerlake/singerlake.yml").read_text())
    lines += ["## singerlake (utility)", "", "| setting | secret | default | description |", "|---|---|---|---|"]
    for setting in utility["settings"]:
        secret = "yes" if setting.get("sensitive") else ""
        lines.append(f"| `{setting['name']}` | {secret} | {cell(setting.get('value', ''))} | {cell(setting['description'])} |")
    lines += ["", "Its commands (`meltano run … singerlake:COMMAND`, `meltano invoke singerlake:COMMAND`):", ""]
    lines += ["| command | runs | what it does |", "|---|---|---|"]
    for name, command in utility["commands"].items():
        lines.append(f"| `singerlake:{name}` | `singerlake {cell(command['args'])}` | {cell(command['description'])} |")
    return "\n".join(lines) + "\n"


# -- the format ------------------------------------------------------------------------------------
def spec_page() -> str:
    spec = (REPO / "shared" / "SPEC.md").read_text()
    return re.sub(r"^## §(\d+) (.*)$", r"## §\1 \2 {#s\1}", spec, flags=re.M)
