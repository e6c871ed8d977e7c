"""Issue 49, finding 11: the daemon's chmod of the shared snapshot directory never follows a
link (a link put in its place must not make its target world-writable)."""

from __future__ import annotations

import os
import stat

from malletrain.daemon.jobs.store_files import prepare_state_dir


def test_the_state_dir_is_made_sticky_and_a_link_in_its_place_is_left_alone(tmp_path):
    own = tmp_path / "inst"
    prepare_state_dir(own)
    assert stat.S_IMODE(os.lstat(own).st_mode) == 0o1777
    target = tmp_path / "private"
    target.mkdir(mode=0o700)
    link = tmp_path / "linked"
    link.symlink_to(target)
    prepare_state_dir(link)
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o700
