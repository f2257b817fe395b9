"""`python -m tuner` and the `tuner` command (pyproject.toml's script): the command line's entry, which
imports the commands inside its own handler, so that a Ctrl-C or SIGTERM landing while they load (the
first fraction of a second) is one line and exit 130 or 143 as anywhere later, never a traceback or a
silent death."""

import signal
import sys


class _EarlyTerm(KeyboardInterrupt):
    pass


def _on_early_sigterm(signum, frame):
    raise _EarlyTerm()


def run() -> int:
    try:
        signal.signal(signal.SIGTERM, _on_early_sigterm)     # main() puts its own in place of this one
        from tuner.cli import entry
        return entry()
    except KeyboardInterrupt as e:
        # only before main() has its own handlers (loading the commands, building the parser)
        what = "terminated" if isinstance(e, _EarlyTerm) else "interrupted"
        print(f"tuner: {what} before the command began; nothing was done", file=sys.stderr)
        return 143 if isinstance(e, _EarlyTerm) else 130


if __name__ == "__main__":
    raise SystemExit(run())
