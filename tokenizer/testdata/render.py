#!/usr/bin/env python3
"""Renders chat templates as transformers' apply_chat_template does, with
Debian's python3-jinja2: an ImmutableSandboxedEnvironment with trim_blocks
and lstrip_blocks, loop controls, a tojson that keeps non-ASCII text, and
raise_exception. Reads {"templates": {name: source}, "vars": {...},
"chats": [[{role, content}]]} from argv[1] and prints
{name: [text, or {"error": message}, per chat]}."""
import json
import sys

import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateError(Exception):
    pass


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    out = {}
    for name, src in spec["templates"].items():
        t = env.from_string(src)
        rows = []
        for chat in spec["chats"]:
            try:
                rows.append(t.render(messages=chat, add_generation_prompt=True, **spec["vars"]))
            except TemplateError as e:
                rows.append({"error": str(e)})
        out[name] = rows
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
