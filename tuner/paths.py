"""Where the repository's data folders are, reading JSON files, and every write the tool makes.

Every file the tool writes goes through `confined` (directly, or through the atomic writers
below): the file must lie inside the folder it belongs to (its root: a results folder, the
runs folder of a night, an engine's config folder), no folder between that root and the file
may be a symbolic link (a link planted there would carry the write anywhere), those folders
are created one by one here, never through a link, and the file itself is written to a
temporary file and renamed over the target, so a link at the target is replaced, never
followed, and a reader sees the old file or the whole new one.

What is at the target decides whether it may be replaced at all (`replaceable`): never a folder,
a device, a FIFO or a socket; and where the user named the path (`tuner ceilings --out FILE`,
the files a command writes into a folder given as --out), only a file of the kind the command
writes (a `Kind`, tuner/file_kinds.py), never a link: anything else is refused in one line.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tuner.errors import TunerError, is_disk_full, os_error_words  # noqa: F401 (is_disk_full: re-exported)

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS_DIR = REPO_ROOT / "configs"
MODELS_DIR = CONFIGS_DIR / "models"
SPACES_DIR = CONFIGS_DIR / "spaces"
TMP_SUFFIX = ".tmp"
# Folders laid out like configs/ whose data is read after the repository's (a GPU or an engine
# release added by a file, without touching the code): ':'-separated, in order.
CONFIG_DIRS_VARIABLE = "TUNER_CONFIG_DIRS"


def config_dirs() -> list[Path]:
    """configs/, then each folder TUNER_CONFIG_DIRS names (read each time: a test or a caller may set it)."""
    extra = [Path(d) for d in os.environ.get(CONFIG_DIRS_VARIABLE, "").split(os.pathsep) if d.strip()]
    return [CONFIGS_DIR, *extra]


def new_file_mode() -> int:
    """What open() would give a new file: 0666 less the umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def read_json(path: Path, what: str = "", then: str = ""):
    """The JSON in `path`, or one clear line: unreadable, too large, or not JSON. `what`
    names the kind of file in the message ("table "), `then` says what follows
    ("; refusing ..."). Read with the bounds of tuner/reading.py."""
    from tuner.reading import read_json_file
    return read_json_file(path, what, then)


def inside(path: Path, root: Path) -> bool:
    """Whether `path`, resolved (symbolic links and `..` followed), lies under `root`."""
    try:
        Path(os.path.realpath(path)).relative_to(os.path.realpath(root))
        return True
    except ValueError:
        return False


def _refuse(path: Path, e: OSError, doing: str = "write") -> TunerError:
    return TunerError(f"cannot {doing} {path}: {os_error_words(e)}")


def make_folder(folder: Path, root: Path | None = None) -> Path:
    """Create `folder` (and the folders up to it) for writing, confined to `root` (default:
    the folder itself, whose own parents are the user's choice): every folder below `root`
    is created here, one by one, and one that is a symbolic link or not a folder is refused
    in one line. Returns the folder."""
    folder = Path(os.path.abspath(folder))
    root = Path(os.path.abspath(root)) if root is not None else folder
    try:
        rel = folder.relative_to(root)
    except ValueError:
        raise TunerError(f"{folder} is outside {root}: refusing to write there") from None
    try:
        if os.path.lexists(root) and not os.path.isdir(root):
            raise TunerError(f"{root} is not a folder" + (" (a broken or looping symbolic link)"
                                                          if os.path.islink(root) else ""))
        os.makedirs(root, exist_ok=True)
    except OSError as e:
        raise _refuse(root, e, "create the folder") from None
    here = root
    for part in rel.parts:
        here = here / part
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            try:
                os.mkdir(here)
            except FileExistsError:          # made by a process beside us; checked below
                st = os.lstat(here)
            except OSError as e:
                raise _refuse(here, e, "create the folder") from None
            else:
                continue
        except OSError as e:
            raise _refuse(here, e, "create the folder") from None
        if stat.S_ISLNK(st.st_mode):
            raise TunerError(f"{here} is a symbolic link: tuner does not write through links (it could lead "
                             f"outside {root}); remove it")
        if not stat.S_ISDIR(st.st_mode):
            raise TunerError(f"{here} is not a folder")
    return folder


def confined(path: Path, root: Path | None = None) -> Path:
    """`path`, checked and prepared for writing a file inside `root` (default: the file's
    own folder): `path` lies inside `root` ('..' cannot climb out), and the folders between
    them exist, none of them a symbolic link (see make_folder). The file itself is then
    written by renaming over it (the atomic writers), so a link there is replaced, never
    followed."""
    path = Path(os.path.abspath(path))
    root = Path(os.path.abspath(root)) if root is not None else path.parent
    if path == root or root not in path.parents:
        raise TunerError(f"{path} is outside {root}: refusing to write there")
    make_folder(path.parent, root)
    return path


@dataclass(frozen=True)
class Kind:
    """A kind of file the tool writes where the user says (tuner/file_kinds.py): what may be
    replaced at such a path. `ours` tells one by its content (a format tag, a first line),
    reading a bounded part of it, and never raises."""
    what: str                              # "a ceilings file (format tuner-ceilings/1)"
    ours: Callable[[Path], bool]


def _not_regular(mode: int) -> str:
    return ("a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


def replaceable(path: Path, kind: Kind | None = None, name: str = "") -> None:
    """One line unless a file may be written at `path`: nothing there, or a regular file (and,
    with `kind`, one of that kind: a path the user named). A folder, a device, a FIFO or a socket
    is never replaced (as root, /dev/null would be replaced for every process); a symbolic link
    is replaced, never followed, inside a folder of ours (no kind), refused at a path the user
    named. `name`: how the message names the path ("--out notes.txt")."""
    name = name or str(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise _refuse(Path(path), e) from None
    if stat.S_ISDIR(st.st_mode):
        raise TunerError(f"{name} is a folder: give the path of a file")
    if stat.S_ISLNK(st.st_mode):
        if kind is None:
            return
        raise TunerError(f"{name} is a symbolic link: tuner neither writes through a link nor replaces one; "
                         "give the path of a file")
    if not stat.S_ISREG(st.st_mode):
        raise TunerError(f"{name} is {_not_regular(st.st_mode)}, not a file: tuner never replaces it; give "
                         "another path")
    if kind is not None and st.st_size and not kind.ours(Path(path)):     # an empty file: nothing to lose
        raise TunerError(f"{name} exists and is not {kind.what}: tuner replaces only that; remove it or give "
                         "another path")


def check_output(path: Path, kind: Kind, option: str = "--out") -> None:
    """Before any work: one line when the file a command will write at `path` (a path the user
    named, or one in a folder the user named) cannot be written or must not be replaced."""
    check_writable(path, option, folder=False)
    replaceable(Path(path), kind, f"{option} {path}" if option else str(path))


def atomic_write_file(path: Path, fill: Callable[[Path], None], root: Path | None = None,
                      kind: Kind | None = None) -> None:
    """Write a file through `fill(temporary path)` (a plot's savefig, a tarball) so that
    readers see the old file or the whole new one, confined to `root` (see `confined`).

    The data goes to a temporary file in the same folder (same file system), is flushed to
    disk, then renamed over the target: a kill at any moment leaves no half-written file
    behind (a stray `.<name>.*.tmp` at worst, which the next write of the file, or
    remove_stale_temporaries, clears: the writer holds a lock on it while it lives), and
    a symbolic link at the target is replaced, not followed. The file keeps the mode of the
    file it replaces, else gets the umask's (an engine running as another user must read
    what we install). What is at the target must be replaceable (see `replaceable`; `kind`:
    a path the user named)."""
    path = confined(path, root)
    replaceable(path, kind)
    try:
        st = os.lstat(path)
        mode = st.st_mode & 0o7777 if stat.S_ISREG(st.st_mode) else new_file_mode()
    except FileNotFoundError:
        mode = new_file_mode()
    except OSError as e:
        raise _refuse(path, e) from None
    remove_stale_temporaries_of(path)         # what a killed writer of this file left
    try:
        held, tmp = new_temporary(path)
    except OSError as e:
        if is_disk_full(e):
            raise
        raise _refuse(path, e) from None
    try:
        fill(Path(tmp))
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError) and e.filename is None and e.errno is not None:
            # a write's ENOSPC or EFBIG names no file: the line that says it names the target
            raise OSError(e.errno, e.strerror or os.strerror(e.errno), str(path)) from e
        raise
    finally:
        os.close(held)                         # the writer's lock goes with it


def atomic_write_text(path: Path, text: str, root: Path | None = None, kind: Kind | None = None) -> None:
    """`text` into `path`, atomically and confined (see atomic_write_file)."""
    def fill(tmp: Path) -> None:
        with open(tmp, "w") as f:
            f.write(text)
    atomic_write_file(path, fill, root, kind=kind)


def atomic_write_bytes(path: Path, data: bytes, root: Path | None = None, kind: Kind | None = None) -> None:
    """`data` into `path`, atomically and confined, byte for byte (see atomic_write_file)."""
    def fill(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
    atomic_write_file(path, fill, root, kind=kind)


def open_for_append(path: Path, root: Path | None = None, truncate: bool = False, kind: Kind | None = None):
    """A text file opened to stream lines into (a landscape's .partial, a step's log),
    confined to `root`, never through a symbolic link at the file itself; with `kind`, a file
    there must be of that kind (see `replaceable`)."""
    path = confined(path, root)
    if kind is not None:
        replaceable(path, kind)
    # O_NONBLOCK: a FIFO put there (a race with any check by name) is refused, not waited on forever
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | (os.O_TRUNC if truncate else os.O_APPEND)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:            # O_NOFOLLOW met a link
            raise TunerError(f"{path} is a symbolic link: tuner does not write through links; remove it") from None
        if e.errno in (errno.ENXIO, errno.EISDIR):
            raise TunerError(f"{path} is not a regular file; remove it") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):      # a FIFO with a reader, a device: not ours to append to
        os.close(fd)
        raise TunerError(f"{path} is not a regular file; remove it")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "w")


def finite_json(obj):
    """obj with every NaN or infinity replaced by None: JSON has no such numbers (strict
    readers refuse them), and where we have one it means "no number"."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def atomic_write_json(path: Path, obj, indent: int | None = 4, root: Path | None = None,
                      kind: Kind | None = None) -> None:
    atomic_write_text(path, json.dumps(finite_json(obj), indent=indent, allow_nan=False) + "\n", root, kind=kind)


def new_temporary(path: Path) -> tuple[int, str]:
    """(fd, name) of a new temporary file beside `path` (`.<name>.<random>.tmp`), locked
    (flock) through `fd` for as long as it stays open: while its writer lives the lock is
    held, and the kernel drops it when the writer dies, kill -9 included. So a temporary
    nobody holds is one a killed writer left, whatever its age (see _dead_temporary)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:200]}.", suffix=TMP_SUFFIX)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    return fd, tmp


# An empty temporary is taken for a dead writer's only once it is this old: between mkstemp and
# the flock on it (microseconds) a live writer's is not locked yet. One with content was locked
# before its first byte (new_temporary), so an unlocked one is a dead writer's at any age.
UNLOCKED_GRACE_S = 1.0


def _dead_temporary(tmp: Path, older_than_s: float) -> bool:
    """Whether `tmp` is a temporary file no live writer holds (its lock can be taken) and at
    least `older_than_s` old (and UNLOCKED_GRACE_S, when it is empty)."""
    try:
        st = os.lstat(tmp)
        age = time.time() - st.st_mtime
        if not stat.S_ISREG(st.st_mode) or age < older_than_s or (st.st_size == 0 and age < UNLOCKED_GRACE_S):
            return False
        fd = os.open(tmp, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False                          # held: its writer is at work
    finally:
        os.close(fd)


def remove_stale_temporaries_of(path: Path, older_than_s: float = 0.0) -> list[Path]:
    """Remove the temporary files that writes of `path` left when killed (`.<name>.*.tmp`
    beside it, that no live writer holds): in a folder of the user's, only those of this file."""
    path = Path(path)
    removed: list[Path] = []
    try:
        found = list(path.parent.glob(f".{glob_escape(path.name[:200])}.*{TMP_SUFFIX}"))
    except OSError:
        return removed
    for tmp in found:
        try:
            if _dead_temporary(tmp, older_than_s):
                tmp.unlink()
                removed.append(tmp)
        except OSError:
            continue
    return removed


def glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[]" else c for c in name)


FOLDER_LOCK = ".tuner-lock"


def new_temporary_folder(parent: Path, prefix: str) -> tuple[Path, int]:
    """(folder, fd) of a new temporary folder `<prefix><random>.tmp` in `parent`, with a lock
    (flock) on a file in it held through `fd` while its maker lives: a killed maker's (a
    download, an extraction) is found by remove_dead_temporary_folders, a live one's never.
    The maker closes `fd`; the lock file is removed with release_temporary_folder before the
    folder is renamed into place."""
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=prefix, suffix=TMP_SUFFIX))
    try:
        fd = os.open(tmp / FOLDER_LOCK, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp, fd


def release_temporary_folder(tmp: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp / FOLDER_LOCK)


def remove_dead_temporary_folders(parent: Path, prefix: str) -> list[Path]:
    """Remove the temporary folders (`<prefix>*.tmp` in `parent`) whose makers were killed:
    those whose lock nobody holds (or, made before their lock, older than UNLOCKED_GRACE_S)."""
    import shutil
    removed: list[Path] = []
    try:
        found = [d for d in parent.glob(f"{glob_escape(prefix)}*{TMP_SUFFIX}") if d.is_dir() and not d.is_symlink()]
    except OSError:
        return removed
    for d in found:
        try:
            fd = os.open(d / FOLDER_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                if time.time() - d.stat().st_mtime > UNLOCKED_GRACE_S * 60:
                    shutil.rmtree(d, ignore_errors=True)
                    removed.append(d)
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue                          # its maker lives
        finally:
            os.close(fd)
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def remove_stale_temporaries(folder: Path, older_than_s: float = 0.0) -> list[Path]:
    """Remove the temporary files atomic writes left when killed (`.<name>.<random>.tmp`)
    under `folder`: those no live writer holds (see new_temporary), older than
    `older_than_s`. A live writer's is never touched, so any command may call this on the
    folder it writes into, with others writing there at the same time."""
    removed: list[Path] = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for tmp in folder.rglob(f".*{TMP_SUFFIX}"):
        try:
            if _dead_temporary(tmp, older_than_s):
                tmp.unlink()
                removed.append(tmp)
        except OSError:
            continue
    return removed


def writable_folder(path: Path) -> tuple[bool, Path]:
    """(whether a file can be created at or under `path`, the folder that decides it). A
    path that cannot be looked at (a name too long, a link loop) cannot be written."""
    p = Path(os.path.abspath(path))
    while True:
        try:
            os.stat(p)
            break
        except FileNotFoundError:
            if p.parent == p:
                return False, p
            p = p.parent
        except OSError:
            return False, p
    return p.is_dir() and os.access(p, os.W_OK | os.X_OK), p


def check_writable(path: Path, option: str = "--out", folder: bool = True) -> None:
    """Before any work: one line when `path` (a folder to write into, or with folder=False a
    file to write) cannot be written: read-only, no permission, a name too long, a link loop,
    a file where a folder belongs (or the reverse)."""
    p = Path(os.path.abspath(path))
    name = f"{option} {path}" if option else str(path)
    if any(len(part.encode()) > 255 for part in p.parts):
        raise TunerError(f"{name}: a name in the path is too long (at most 255 bytes)")
    if len(os.fsencode(p)) >= 4096:
        raise TunerError(f"{name}: the path is too long")
    if os.path.islink(p) and not os.path.exists(p):
        raise TunerError(f"{name} is a broken or looping symbolic link")
    if folder and os.path.exists(p) and not os.path.isdir(p):
        raise TunerError(f"{name} is a file, not a folder")
    if not folder and os.path.isdir(p):
        raise TunerError(f"{name} is a folder; give a file name")
    ok, existing = writable_folder(p if folder else p.parent)
    if not ok:
        why = ("a link loop or a name it cannot look at" if not os.path.exists(existing)
               else "not a folder" if not existing.is_dir() else "read-only, or no permission")
        raise TunerError(f"cannot write to {existing} ({name}): {why}")
