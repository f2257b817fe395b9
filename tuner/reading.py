"""Reading the files the tool is given, within bounds.

Every file format the tool reads comes through here: JSON (tables, manifests, nightly state,
HF config.json, ceilings), YAML (models, spaces, nightly configs), text line by line
(landscapes, gzipped or not) and members of zip archives (the engines' wheels). Each is read
with a ceiling on its size (decompressed size for gzip and zip: a small bomb cannot take the
memory), on the length of one line, and for YAML on what aliases expand to (a "billion
laughs" document is refused, not built); anything that is not a regular file (a FIFO, a
device) is refused rather than waited on. A file over a bound is one `tuner: error:` line
saying which bound.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import re
import stat
import zipfile
import zlib
from pathlib import Path
from typing import Iterator

import yaml

from tuner.errors import TunerError, os_error_words

MAX_FILE_BYTES = 64 << 20          # a JSON or YAML file: tables, manifests, models, state (MiB, not GiB)
MAX_LANDSCAPE_BYTES = 1 << 30      # a landscape, decompressed (a recording of every config of a model: ~100 MiB)
MAX_LINE_BYTES = 1 << 20           # one line of a landscape (a measurement is ~300 bytes)
MAX_MEMBER_BYTES = 16 << 20        # one file read out of a wheel (the engines' kernel files: ~100 KiB)
MAX_YAML_NODES = 100_000           # what a YAML document holds once its aliases are expanded
MAX_NESTING = 200                  # how deep JSON or YAML may nest


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


def _open_regular(path: Path, what: str) -> tuple[int, os.stat_result]:
    """(fd, stat) of `path` opened without waiting (a FIFO must not block us) and checked to be
    a regular file through that same fd (no swap between a check and the open); one clear line
    otherwise, the fd closed. The caller closes the fd."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise TunerError(f"cannot read {what}{path}: {os_error_words(e)}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TunerError(f"{what}{path} is not a regular file")
    except BaseException as e:
        os.close(fd)
        if isinstance(e, OSError):
            raise TunerError(f"cannot read {what}{path}: {os_error_words(e)}") from None
        raise
    return fd, st


def read_bytes(path: str | Path, what: str = "", limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, or one clear line. `what` names
    the kind of file ("table ")."""
    path = Path(path)
    fd, st = _open_regular(path, what)
    try:
        if st.st_size > limit:
            raise TunerError(f"{what}{path} is {_mib(st.st_size)}; at most {_mib(limit)} is read")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise TunerError(f"{what}{path} is larger than {_mib(limit)} (it grew while read?)")
        return b"".join(chunks)
    except OSError as e:
        raise TunerError(f"cannot read {what}{path}: {os_error_words(e)}") from None
    finally:
        os.close(fd)


def read_head(path: str | Path, n: int, what: str = "") -> bytes:
    """The first `n` bytes of a regular file (a header to recognize it by), whatever its
    length; one clear line when it cannot be read or is no regular file."""
    path = Path(path)
    fd, _ = _open_regular(path, what)
    try:
        return os.pread(fd, n, 0)
    except OSError as e:
        raise TunerError(f"cannot read {what}{path}: {os_error_words(e)}") from None
    finally:
        os.close(fd)


def read_text(path: str | Path, what: str = "", limit: int = MAX_FILE_BYTES) -> str:
    data = read_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise TunerError(f"{what}{path} is not UTF-8 text") from None


_JSON_NESTING = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def nests_deeper(text: str | bytes, limit: int) -> bool:
    """Whether JSON `text` nests arrays and objects more than `limit` deep (strings skipped).
    Said without parsing it: Python's JSON reader recurses once per level, so how deep it may
    go would otherwise depend on the process's recursion limit (which libraries and tests
    raise), and deep enough, on the C stack."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    for m in _JSON_NESTING.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > limit:
                return True
        elif c in "]}":
            depth -= 1
    return False


def parse_json(text: str, where: str, then: str = ""):
    """The JSON value of `text`; one line naming `where` when it is not JSON or nests more
    than MAX_NESTING deep (no file of ours nests more than a few levels)."""
    if nests_deeper(text, MAX_NESTING):
        raise TunerError(f"{where} is nested too deeply to be a file of ours{then}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TunerError(f"{where} is not valid JSON: {e}{then}") from None
    except RecursionError:
        raise TunerError(f"{where} is nested too deeply to be a file of ours{then}") from None
    except ValueError as e:         # a number of more than 4300 digits (Python's limit on int())
        raise TunerError(f"{where} holds a number too long to read ({str(e).split(':')[0].lower()}): "
                         f"not a file of ours{then}") from None


def read_json_file(path: str | Path, what: str = "", then: str = "", limit: int = MAX_FILE_BYTES):
    """The JSON in `path` within the bounds; `then` follows the reason ("; refusing ...")."""
    try:
        text = read_text(path, what, limit)
    except TunerError as e:
        raise TunerError(f"{e}{then}") from None
    return parse_json(text, f"{what}{path}", then)


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, whose document is checked before it is built: what its aliases
    expand to, how deep it nests (a cycle of aliases expands without end), and that no mapping
    holds a key twice."""


def _expanded_size(node: yaml.Node, depth: int, memo: dict[int, int], active: set[int]) -> int:
    if depth > MAX_NESTING:
        raise TunerError("nests too deeply")
    key = id(node)
    if key in memo:
        return memo[key]
    if key in active:
        raise TunerError("holds an alias to itself (a cycle)")
    active.add(key)
    size = 1
    if isinstance(node, yaml.SequenceNode):
        for child in node.value:
            size += _expanded_size(child, depth + 1, memo, active)
            if size > MAX_YAML_NODES:
                break
    elif isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge":
                if k.value in seen:         # PyYAML keeps the last silently: a misspelt copy would win unsaid
                    raise TunerError(f"has the key {k.value!r} twice in one mapping (line {k.start_mark.line + 1})")
                seen.add(k.value)
            size += _expanded_size(k, depth + 1, memo, active) + _expanded_size(v, depth + 1, memo, active)
            if size > MAX_YAML_NODES:
                break
    active.discard(key)
    memo[key] = size
    if size > MAX_YAML_NODES:
        raise TunerError(f"expands to more than {MAX_YAML_NODES} values through its aliases (a 'billion laughs'?)")
    return size


def parse_yaml(text: str, where: str):
    """The YAML document in `text` (safe tags only), after checking what it expands to;
    one line naming `where` otherwise."""
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, 0, {}, set())
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise TunerError(f"{where} is not valid YAML: {str(e).splitlines()[0]}") from None
    except TunerError as e:
        raise TunerError(f"{where} {e}") from None
    except RecursionError:
        raise TunerError(f"{where} nests too deeply") from None
    finally:
        loader.dispose()


def read_yaml_file(path: str | Path, what: str = "", limit: int = MAX_FILE_BYTES):
    return parse_yaml(read_text(path, what, limit), f"{what}{path}")


@contextlib.contextmanager
def _open_stream(path: Path, what: str) -> Iterator[io.BufferedIOBase]:
    """A binary stream of the file's content, gunzipped for .gz; a regular file only."""
    fd, _ = _open_regular(path, what)
    with os.fdopen(fd, "rb") as raw:
        yield gzip.GzipFile(fileobj=raw, mode="rb") if path.name.endswith(".gz") else raw


def text_lines(path: str | Path, what: str = "", max_line: int = MAX_LINE_BYTES,
               max_total: int = MAX_LANDSCAPE_BYTES) -> Iterator[tuple[int, str]]:
    """(line number, line) of a text file (gunzipped when named .gz), streamed: a line longer
    than `max_line` bytes, or more than `max_total` bytes in all (decompressed), is one clear
    line, never a read of the whole thing into memory."""
    path = Path(path)
    total = 0
    with _open_stream(path, what) as f:
        n = 0
        while True:
            n += 1
            try:
                raw = f.readline(max_line + 1)
            except (OSError, EOFError, zlib.error) as e:
                raise TunerError(f"cannot read {what}{path}: {e}") from None
            if not raw:
                return
            if len(raw) > max_line:
                raise TunerError(f"{what}{path}: line {n} is longer than {_mib(max_line)}; not a file of ours")
            total += len(raw)
            if total > max_total:
                raise TunerError(f"{what}{path} holds more than {_mib(max_total)}"
                                 f"{' once decompressed' if path.name.endswith('.gz') else ''}; at most that is read")
            try:
                yield n, raw.decode("utf-8")
            except UnicodeDecodeError:
                raise TunerError(f"{what}{path}: line {n} is not UTF-8 text") from None


def first_line(path: str | Path, what: str = "", max_line: int = MAX_LINE_BYTES) -> str:
    """Line 1 of a text file (gunzipped for .gz), bounded like text_lines; '' when empty."""
    for _, line in text_lines(path, what, max_line, max_line + 1):
        return line
    return ""


def last_line(path: str | Path, tail: int = 64 << 10) -> str | None:
    """The last non-empty line of a text file (a step's log), read from its last `tail`
    bytes only, whatever its length; None when it cannot be read or is no regular file."""
    try:
        fd, st = _open_regular(Path(path), "")
    except TunerError:
        return None
    try:
        data = os.pread(fd, tail, max(0, st.st_size - tail))
    except OSError:
        return None
    finally:
        os.close(fd)
    lines = [ln for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


MAX_ZIP_MEMBERS = 200_000          # files in one wheel (vLLM's: ~3,000)


def open_zip(path: str | Path, what: str = "the wheel ") -> zipfile.ZipFile:
    """A zip archive (a wheel) to read members from with zip_member: a regular file (a FIFO or
    a device named like a wheel is refused, never waited on), whose directory lists at most
    MAX_ZIP_MEMBERS files; one clear line otherwise."""
    path = Path(path)
    fd, _ = _open_regular(path, what)
    try:
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    try:
        zf = zipfile.ZipFile(f)
    except (OSError, zipfile.BadZipFile, zlib.error, EOFError, ValueError) as e:
        f.close()
        raise TunerError(f"cannot read {what}{path}: {e}") from None
    if len(zf.infolist()) > MAX_ZIP_MEMBERS:
        zf.close()
        raise TunerError(f"{what}{path} lists more than {MAX_ZIP_MEMBERS} files: not a wheel of an engine")
    return zf


def zip_member(zf: zipfile.ZipFile, name: str, where: str, limit: int = MAX_MEMBER_BYTES) -> bytes:
    """One file of a zip archive (a wheel), at most `limit` bytes once decompressed: the size
    its header claims is checked first, and the reading stops at the limit whatever the header
    said (a zip bomb lies there). KeyError when the archive has no such file."""
    info = zf.getinfo(name)
    if info.file_size > limit:
        raise TunerError(f"{where}: {name} is {_mib(info.file_size)} decompressed; at most {_mib(limit)} is read "
                         "(not a kernel file: a zip bomb?)")
    try:
        with zf.open(info) as f:
            data = f.read(limit + 1)
    except (OSError, zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as e:
        raise TunerError(f"{where}: cannot read {name}: {e}") from None
    if len(data) > limit:
        raise TunerError(f"{where}: {name} decompresses to more than {_mib(limit)} (a zip bomb?)")
    return data


def first_tar_member(path: str | Path, limit: int = 64 << 10) -> str | None:
    """The name of the first member of a gzipped tar (a proof's bundle), from its first `limit`
    bytes decompressed to at most as many (its first header and an extended header before it);
    None when that is no tar. One clear line when the file cannot be read."""
    import tarfile
    head = read_head(path, limit, "tarball ")
    try:
        data = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, limit)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            first = tar.next()          # the first member (after any extended header)
    except (zlib.error, tarfile.TarError, EOFError, OSError):
        return None
    return first.name if first is not None else None


LANDSCAPE_HEADER_BYTES = 64 << 10   # line 1 of a landscape: a header is a few hundred bytes


def landscape_header(path: str | Path) -> dict:
    """Line 1 of a landscape (tuner/measure/landscape.py), e.g. to learn its kernel before
    reading the rest (read within bounds: a file of one huge line is refused, never read
    whole). Here, below every stage, because the plan asks it too: which kernel a replayed
    landscape was recorded on (tuner/plan/kernel_registry.py)."""
    try:
        return json.loads(first_line(path, "landscape ", LANDSCAPE_HEADER_BYTES))
    except TunerError as e:
        raise TunerError(f"cannot read the header of landscape {path}: {e}") from None
    except (json.JSONDecodeError, RecursionError) as e:
        raise TunerError(f"cannot read the header of landscape {path}: {e}") from None
