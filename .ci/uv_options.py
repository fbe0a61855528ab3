"""Print, one per line, the uv options that read packages from where pip is configured to
(``pip config list``: index URLs, find-links, constraints; files and environment alike), so that
``uv pip install`` resolves from the same sources as ``pip install`` would."""

import subprocess
import sys

OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}

listing = subprocess.run(
    [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
).stdout
seen: list[tuple[str, str]] = []
for line in listing.splitlines():
    key, _, value = line.partition("=")
    option = OPTIONS.get(key.rsplit(".", 1)[-1])
    if option is None:
        continue
    for item in value.strip("'\"").split():
        if (option, item) not in seen:
            seen.append((option, item))
for option, item in seen:
    print(option)
    print(item)
