"""Build an index beside `index --out DIR` and move it in only when it is whole.

The index is written into a temporary directory beside DIR (`.tmp-index-*`, on the same file
system, so its entries move by rename). When the build has finished, the entries of an old index
in DIR (`retrieval.index.INDEX_ENTRIES`, if any) are moved aside, the new ones moved in (the
manifest last, so no manifest ever names files of the other index) and the old ones removed;
anything else in DIR is kept. A build that fails or is interrupted at any point (a bad corpus
line, a full disk, Ctrl-C) leaves DIR as it was, and neither the staging directory nor a
directory made for it behind. A rename that fails during the swap moves the old entries back.
"""
from __future__ import annotations

import os
import shutil
import tempfile

from memsearcher_jax.errors import UserInputError
from retrieval.index import INDEX_ENTRIES, MANIFEST

STAGING_PREFIX = ".tmp-index-"


class StagedIndex:
    """`with StagedIndex(out) as staged:` build into `staged.path`, then `staged.install()`.

    Opening it is the check that --out can be written (a UserInputError naming the directory
    that cannot, before any work); leaving it without `install()` removes everything it made."""

    def __init__(self, out: str):
        self.out = out
        self.target = os.path.realpath(os.path.expanduser(out))  # a link to a directory: its target
        if os.path.islink(os.path.expanduser(out)) and not os.path.exists(self.target):
            raise UserInputError(f"--out {out!r} is a link to {self.target}, which does not exist; give a directory")
        self.parent = os.path.dirname(self.target)
        self.existed = os.path.isdir(self.target)
        self.held_index = os.path.exists(os.path.join(self.target, MANIFEST))
        self._made: list[str] = []  # the missing ancestors made for the staging directory, outermost first
        here = self.parent
        while not os.path.exists(here):
            self._made.insert(0, here)
            here = os.path.dirname(here)
        self.path = ""
        self.installed = False
        self.stranded = ""  # where old entries stay when a failed swap could not move them all back

    def __enter__(self) -> StagedIndex:
        if self.existed and not os.access(self.target, os.W_OK):
            raise UserInputError(f"--out {self.out!r}: the directory {self.target} is not writable; the index "
                                 "is moved into it when built: give a writable directory")
        try:
            os.makedirs(self.parent, exist_ok=True)
            self.path = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=self.parent)
        except OSError as e:
            self._remove_made()
            raise UserInputError(f"--out {self.out!r}: cannot create a directory in {e.filename or self.parent} "
                                 f"({e.strerror or e}); the index is built beside --out and moved in when whole: "
                                 "give an --out in a writable directory") from None
        return self

    def __exit__(self, *exc) -> None:
        if self.path:
            shutil.rmtree(self.path, ignore_errors=True)
        if not self.installed:
            self._remove_made()

    def outcome_of_failure(self) -> str:
        """What a failed build left of --out, for its error message."""
        if self.stranded:
            return (f"the old index's entries that could not be moved back into {self.out} are in "
                    f"{self.stranded}: move them back by hand")
        if self.held_index:
            return f"the index in {self.out} is untouched"
        return f"nothing was written to {self.out}"

    def install(self) -> None:
        """Swap the staged index into --out (see the module docstring)."""
        made_out = not self.existed
        os.makedirs(self.target, exist_ok=True)
        aside = tempfile.mkdtemp(prefix=STAGING_PREFIX + "old-", dir=self.parent)
        moved_aside: list[str] = []
        moved_in: list[str] = []
        new = sorted(os.listdir(self.path), key=lambda name: name == MANIFEST)  # the manifest last
        try:
            for name in INDEX_ENTRIES:  # the manifest first: the old index stops being one at once
                if os.path.lexists(os.path.join(self.target, name)):
                    os.replace(os.path.join(self.target, name), os.path.join(aside, name))
                    moved_aside.append(name)
            for name in new:
                os.replace(os.path.join(self.path, name), os.path.join(self.target, name))
                moved_in.append(name)
        except BaseException:
            _move_back(self.target, self.path, moved_in)
            _move_back(aside, self.target, moved_aside)
            if made_out and not os.listdir(self.target):
                os.rmdir(self.target)
            if os.listdir(aside):  # a rename back failed too: say where the old entries are
                self.stranded = aside
            else:
                os.rmdir(aside)
            raise
        self.installed = True
        shutil.rmtree(aside, ignore_errors=True)  # the old index, replaced as --overwrite asked

    def _remove_made(self) -> None:
        """Remove the ancestors made for the staging directory, innermost first, while empty."""
        for path in reversed(self._made):
            try:
                os.rmdir(path)
            except OSError:
                return


def _move_back(src_dir: str, dst_dir: str, names: list[str]) -> None:
    """Move `names` from src_dir back to dst_dir, the last moved first, each tried on its own."""
    for name in reversed(names):
        try:
            os.replace(os.path.join(src_dir, name), os.path.join(dst_dir, name))
        except OSError:
            pass  # left in src_dir (the staging or the aside directory), which is kept if not empty
