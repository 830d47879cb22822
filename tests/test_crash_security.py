"""Security posture: private by default, no links followed, no pickle, no network file systems.

Invariant: a queue created with the defaults is readable and writable by its owner only (0700
directory, 0600 files, whatever the umask); the ``mode`` option widens that on purpose; ringq
never follows a symbolic link inside the queue directory; and a queue on NFS/SMB is refused
unless explicitly allowed.  (Links, pickles and decoded sizes: tests/test_crash_hostile.py.)
"""

from __future__ import annotations

import os
import stat

import pytest
from crashkit import NAME, open_queue

from ringq.engine import ring as ring_mod
from ringq.errors import UnsupportedFilesystemError


@pytest.fixture
def umask():
    def set_(mask):
        os.umask(mask)

    old = os.umask(0o022)
    yield set_
    os.umask(old)


def _modes(path):
    return {f: stat.S_IMODE(os.lstat(os.path.join(path, f)).st_mode) for f in os.listdir(path)}


def _exercise(q):
    q.enqueue(1)
    job = q.lease_one()
    q.nack(job, error="e", delay=0)  # creates the .err side file
    q.enqueue_many(list(range(20)))  # rotates


@pytest.mark.parametrize("mask", [0o000, 0o022, 0o077])
def test_private_by_default(tmp_path, umask, mask):
    umask(mask)
    path = str(tmp_path / "q")
    with open_queue(path) as q:
        _exercise(q)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    modes = _modes(path)
    assert {f"{NAME}.ctl", f"{NAME}.lock", f"{NAME}.owners", f"{NAME}.{1:016x}.err"} <= set(modes)
    assert set(modes.values()) == {0o600}, modes


def test_group_mode_on_purpose(tmp_path, umask):
    umask(0o007)
    path = str(tmp_path / "q")
    with open_queue(path, mode=0o660) as q:
        _exercise(q)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o770
    assert set(_modes(path).values()) == {0o660}


@pytest.mark.parametrize(
    "mode", [0o7777, 0o4600, 0o2660, 0o1600, 0o1000, -1, True, 0o600 * 1.0, "0o600", None]
)
def test_mode_is_permission_bits_only(tmp_path, mode):
    # A setuid, setgid or sticky bit would be applied to every file and directory created.
    path = tmp_path / "q"
    with pytest.raises(ValueError, match="mode must be permission bits"):
        open_queue(str(path), mode=mode)
    assert not path.exists()  # refused before anything was created


def test_existing_directory_mode_is_left_alone(tmp_path):
    os.chmod(tmp_path, 0o755)
    with open_queue(str(tmp_path)) as q:
        q.enqueue(1)
    assert stat.S_IMODE(os.stat(tmp_path).st_mode) == 0o755


MOUNTS = "\n".join(
    [
        "/dev/vda1 / ext4 rw 0 0",
        "server:/export /mnt/nfs nfs4 rw,relatime 0 0",
        "//host/share /mnt/smb\\040share cifs rw 0 0",
        "tmpfs /mnt/nfs/local tmpfs rw 0 0",
        "garbage",
        "",
    ]
)


@pytest.mark.parametrize(
    "path,kind",
    [
        ("/mnt/nfs/q", "nfs4"),
        ("/mnt/nfs", "nfs4"),
        ("/mnt/nfsx/q", "ext4"),
        ("/mnt/smb share/q", "cifs"),
        ("/mnt/nfs/local/q", "tmpfs"),
        ("/var/q", "ext4"),
    ],
)
def test_fs_type_longest_mount_point_wins(path, kind):
    assert ring_mod.fs_type(path, MOUNTS) == kind


def test_network_fs_refused_unless_allowed(tmp_path, monkeypatch):
    monkeypatch.setattr(ring_mod, "fs_type", lambda p, mounts_text=None: "nfs4")
    with pytest.raises(UnsupportedFilesystemError, match="nfs4"):
        open_queue(str(tmp_path / "q"))
    assert not os.path.exists(tmp_path / "q" / f"{NAME}.ctl")  # refused before writing anything
    with open_queue(str(tmp_path / "q"), allow_network_fs=True) as q:
        q.enqueue(1)


def test_every_network_fs_name_is_refused():
    for kind in ("nfs", "nfs4", "cifs", "smb3", "9p", "fuse.sshfs"):
        assert kind in ring_mod.NETWORK_FS


def test_control_file_creation_never_writes_through_a_planted_temp_file(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    path = tmp_path / "q"
    path.mkdir(mode=0o700)
    os.link(victim, path / f"{NAME}.ctl.tmp")  # a hard link planted where the temp file goes
    with open_queue(str(path)) as q:
        q.enqueue(1)
    assert victim.read_bytes() == b"precious"
