"""What a user's directory holds, to check that a command left it as it was."""
from __future__ import annotations

import os


def snapshot(root) -> dict:
    """Every file under root with its bytes, and every directory (what must survive unchanged)."""
    found = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs:
            found[os.path.relpath(os.path.join(dirpath, name), root) + "/"] = b""
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                found[os.path.relpath(os.path.join(dirpath, name), root)] = f.read()
    return found
