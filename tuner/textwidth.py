"""Every line a command prints on a terminal fits 120 columns, or the terminal's width where it
is narrower ($COLUMNS, else the terminal's own): long lines are wrapped at spaces (continuations
indented under their line), a progress line that is redrawn in place is cut instead (a wrapped
one would leave a stale row each redraw), and a shell command meant to be pasted is wrapped only
with ` \\` continuation marks (command_lines), never as prose. Piped into a file or a script with
no $COLUMNS, a line goes through whole: a log keeps each message on one line to grep (a command
printed to be pasted is then cut at 120 columns, with its marks). And nothing a command prints
drives the terminal: a control character (an escape that clears the screen, moves the cursor or
retitles the window, from a file the tool read) or a bidirectional override is printed as its
escape (`\x1b`), whatever printed it. Machine-readable output (JSON, CSV) is never fitted or cut:
a command prints it with print_whole, which a script or a file gets exactly (a newline added inside
a JSON string would make it invalid)."""

from __future__ import annotations

import os
import re
import textwrap

MAX_WIDTH = 120
MIN_WIDTH = 40            # below this a wrapped line says less than a cut one


def width(stream=None) -> int:
    """The columns to fit: $COLUMNS where set (what a shell exports, and what tests set), else the
    terminal's of `stream` when it is one, else 120; never more than 120."""
    cols = None
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        cols = int(env)
    elif stream is not None and hasattr(stream, "isatty"):
        try:
            if stream.isatty():
                cols = os.get_terminal_size(stream.fileno()).columns
        except (OSError, ValueError):
            cols = None
    return max(MIN_WIDTH, min(MAX_WIDTH, cols or MAX_WIDTH))


def output_width() -> int | None:
    """The columns stdout's lines are fitted to, None where they go through whole (piped, no
    $COLUMNS): what a command that lays out its own lines (wraps a table's heading, cuts a
    row) fits them to, so that every command follows the one rule of this module."""
    import sys
    return width(sys.stdout) if terminal_known(sys.stdout) else None


def terminal_known(stream=None) -> bool:
    """Whether a terminal's width is known ($COLUMNS, or `stream` is a terminal): then even an
    error is wrapped to it; piped into a log or a script, an error stays one line to grep."""
    if os.environ.get("COLUMNS", "").isdigit():
        return True
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


# C0 and C1 controls but a tab, a line feed and a carriage return (the progress line's redraw), and
# the bidirectional overrides and isolates (text shown in another order than it is)
_CONTROLS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def shown(text: str) -> str:
    """`text` with every character that would drive a terminal written as its escape."""
    return _CONTROLS.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def error_text(line: str, stream=None) -> str:
    """An error line as printed: one line, wrapped only to a known terminal (terminal_known),
    nothing in it driving the terminal (shown)."""
    line = shown(line)
    return fit_text(line, width(stream)) if terminal_known(stream) else line


def fit_line(line: str, columns: int | None = None) -> list[str]:
    """`line` as lines of at most `columns`: unchanged when it fits, else wrapped at spaces with
    its continuations indented 4 more than it (a word longer than a line is cut)."""
    columns = columns or width()
    if len(line) <= columns:
        return [line]
    body = line.lstrip(" ")
    lead = " " * min(len(line) - len(body), columns // 2)
    return textwrap.wrap(body, columns, initial_indent=lead, subsequent_indent=lead + "    ",
                         break_long_words=True, break_on_hyphens=False) or [line[:columns]]


CONTINUED = " \\"          # a shell command's line that goes on on the next: a shell reads them as one


def _words(command: str) -> list[str]:
    """A command's words as a shell splits them at spaces: a space inside quotes splits nothing."""
    words, word, quote = [], "", None
    for ch in command:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == " ":
            words.append(word)
            word = ""
            continue
        word += ch
    return [*words, word]


def _cut_word(word: str, room: int, state: str | None) -> tuple[str, str, str | None] | None:
    """(the first piece of `word` that fits `room` columns with its mark, the rest, the quote
    open where it is cut) or None: a cut that a shell joins again (a backslash and the line's
    end, which it removes; inside single quotes, closed before it and opened again after it);
    never right after an escaping backslash."""
    best = None
    quote, escaped = state, False
    for i, ch in enumerate(word):
        mark = 2 if quote == "'" else 1
        if i and not escaped and i + mark <= room:
            best = (i, quote)
        if escaped:
            escaped = False
        elif quote == "'":
            quote = None if ch == "'" else quote
        elif ch == "\\":
            escaped = True
        elif quote == '"':
            quote = None if ch == '"' else quote
        elif ch in "'\"":
            quote = ch
    if best is None:
        return None
    i, quote = best
    if quote == "'":
        return word[:i] + "'\\", "'" + word[i:], quote
    return word[:i] + "\\", word[i:], quote


def command_lines(command: str, columns: int | None = None) -> list[str]:
    """A shell command meant to be pasted, as lines of at most `columns` (default: the width
    stdout is fitted to, as Fitting takes it): cut at spaces outside quotes, each line but the
    last ending in ` \\` (continuations indented 4 more), so that pasted it is one command. A
    word longer than a line is cut where a shell joins it again (_cut_word) and goes on at the
    next line's first column."""
    import sys
    columns = max(MIN_WIDTH, columns or (width(sys.stdout) if terminal_known(sys.stdout) else MAX_WIDTH))
    body = command.strip(" ")
    lead = " " * min(len(command) - len(command.lstrip(" ")), columns // 2)
    goes_on = body.endswith(CONTINUED.strip())           # a line of a longer command: it keeps its mark
    body = body.removesuffix(CONTINUED.strip()).rstrip(" ") if goes_on else body
    lines: list[str] = []
    line = lead
    for word in _words(body):
        if line.strip() and len(line) + 1 + len(word) + len(CONTINUED) > columns:
            lines.append(line + CONTINUED)
            line = lead + "    "
        elif line.strip():
            line += " "
        while len(line) + len(word) + len(CONTINUED) > columns:
            cut = _cut_word(word, columns - len(line), None)
            if cut is None:
                break                # (no cut fits: the terminal folds it, and a fold pastes whole)
            piece, word, _ = cut
            lines.append(line + piece)
            line = ""
        line += word
    return [*lines, line + (CONTINUED if goes_on else "")]


def fit_text(text: str, columns: int | None = None) -> str:
    """Every line of `text` fitted (fit_line)."""
    columns = columns or width()
    return "\n".join(out for line in text.split("\n") for out in fit_line(line, columns))


def factor(ratio: float) -> str:
    """A ratio of two times as printed ('1.25x'): two decimals while it is a plausible factor,
    three significant digits beyond (a time of 1e300 against 1 would print 300 digits)."""
    if ratio != ratio:
        return "?x"
    return f"{ratio:.2f}x" if abs(ratio) < 1e4 else f"{ratio:.3g}x"


def cut(line: str, columns: int) -> str:
    """`line` cut to `columns` (a redrawn line), the cut said by its last character."""
    return line if len(line) <= columns else line[:columns - 1] + "~"


def print_whole(text: str, file=None) -> None:
    """`text` and a line feed on `file` (default stdout) as they are, never wrapped or cut whatever
    the terminal's width: machine-readable output (a JSON document, CSV rows) that a program
    reads, where a line break added inside a string or a field changes or breaks it. Only a
    control character is escaped, as everywhere (shown); json.dumps escapes them already, so a
    JSON document goes through byte for byte."""
    import sys
    stream = sys.stdout if file is None else file
    if isinstance(stream, Fitting):
        stream.write_whole(text + "\n")
    else:
        stream.write(shown(text) + "\n")


class Fitting:
    """A text stream whose complete lines are fitted (fit_line) to the width of the terminal it
    writes to ($COLUMNS, or the stream's own); a write holding a carriage return (a redrawn
    progress line, which fits itself) and a flushed partial line go through as they are.
    Everything else is the stream's."""

    def __init__(self, stream):
        self._stream = stream
        self._partial = ""
        # piped into a file or a script with no width given, lines go through whole (one to grep)
        self._columns = width(stream) if terminal_known(stream) else 1 << 30
        self._command = False        # the last line ended in ` \\`: this one goes on a shell command

    def write(self, text: str) -> int:
        n = len(text)
        text = shown(text)
        if "\r" in text:
            self.flush()
            self._stream.write(text)
            return n
        self._partial += text
        if "\n" in self._partial:
            *lines, self._partial = self._partial.split("\n")
            self._stream.write("".join(out + "\n" for line in lines for out in self._fit(line)))
        return n

    def write_whole(self, text: str) -> None:
        """`text` as it is, never fitted (print_whole): after what was written before it."""
        self.flush()                 # a partial line before it goes first, as it is
        self._command = False
        self._stream.write(shown(text))

    def _fit(self, line: str) -> list[str]:
        """A line fitted: a shell command's (one ending in `\\`, or the line after one) with its
        continuation marks (command_lines), never cut like prose; any other by fit_line."""
        command = self._command or line.endswith("\\")
        self._command = line.endswith("\\")
        if command and len(line) > self._columns:
            return command_lines(line, self._columns)
        return fit_line(line, self._columns)

    def flush(self) -> None:
        if self._partial:
            self._stream.write(self._partial)
            self._partial = ""
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)
