"""`python -m tuner` and the `tuner` command (pyproject.toml's script): the command line's entry, which
imports the commands inside its own handler, so that a Ctrl-C landing while they load (the first
fraction of a second) is one line and exit 130 as anywhere later, never a traceback."""

import sys


def run() -> int:
    try:
        from tuner.cli import entry
        return entry()
    except KeyboardInterrupt:
        # only before main() has its own handler (loading the commands, building the parser)
        print("tuner: interrupted before the command began; nothing was done", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(run())
