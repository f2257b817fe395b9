"""Command line: `tuner COMMAND ...`. Each command's options and its run function live in its
module under tuner/commands/ (the heavy libraries load only when a command runs, so `tuner --help`
is quick); here: the list of commands in the order the help shows them, and `main`, which turns
every failure into one line and an exit status (2 bad input, 130/143 interrupted, 1 internal).

Bad input ends with one line on stderr and exit status 2; nothing is written.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Callable

from tuner import __version__
from tuner.commands import (
    audit,
    bench,
    ceilings,
    check,
    coverage,
    drift,
    engine_source,
    install,
    kernel_commands,
    landscape,
    nightly,
    proof,
    report,
    worker,
)
from tuner.commands.options import Parser
from tuner.errors import Terminated, TunerError


# Each command's options and run live in its module under tuner/commands/; this list says the
# order `tuner --help` shows them in, the order of the work: where tuning pays (coverage), tune
# (moe, gemm, mla), install, audit, then the rest: (name, add its parser(s) to `sub`, run it).
def _commands() -> list[tuple[str, Callable[..., None], Callable[[argparse.Namespace], int]]]:
    return [
        ("coverage", coverage.add_parser, coverage.run),
        ("moe", kernel_commands.add_moe_parser, kernel_commands.run),
        ("gemm", kernel_commands.add_gemm_parser, kernel_commands.run),
        ("mla", kernel_commands.add_mla_parser, kernel_commands.run),
        ("install", install.add_parser, install.run),
        ("audit", audit.add_parser, audit.run),
        ("report", report.add_report_parser, report.run_report),
        ("diff", report.add_diff_parser, report.run_diff),
        ("drift", drift.add_parser, drift.run),
        ("nightly", nightly.add_parser, nightly.run),
        ("check", check.add_parser, check.run),
        ("bench", bench.add_parser, bench.run),
        ("ceilings", ceilings.add_parser, ceilings.run),
        ("landscape", landscape.add_parser, landscape.run),
        ("engine-source", engine_source.add_parser, engine_source.run),
        ("proof", proof.add_parser, proof.run),
        ("worker", worker.add_worker_parser, worker.run_worker),
        ("collect", worker.add_collect_parser, worker.run_collect),
        ("repair-journal", worker.add_repair_parser, worker.run_repair),
    ]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tuner", description="Autotune Triton kernel launch configs for Hopper GPUs "
                    "and write the tables vLLM and SGLang read.",
                    epilog="examples:\n  tuner moe --model deepseek-v3 --gpu H200 --dtype fp8_w8a8   # the MoE tables of "
                    "8 H200s\n  tuner moe --model deepseek-v3 --gpu H200 --synthetic           # no GPU: the same, on "
                    "SYNTHETIC times\n(`tuner COMMAND --help` for each command)")
    parser.add_argument("--version", action="version", version=f"tuner {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    common = kernel_commands.common_options()        # gemm, moe and mla's shared options
    for _name, add_parser, _run in _commands():
        add_parser(sub, common)
    from tuner.commands.examples import epilog
    for name, command in sub.choices.items():
        command.epilog = command.epilog or epilog(name)        # each command's help ends with examples
    return parser


class _StderrLines(logging.Handler):
    """The 'tuner' logger's diagnostics as 'tuner: ...' lines on stderr (the stream of the
    moment, so that a caller that swaps sys.stderr gets them)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(f"tuner: {record.getMessage()}\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging must never take the run down
            self.handleError(record)


COMMANDS = {name: run for name, _add, run in _commands()}


_Terminated = Terminated       # the name tests and older callers know


# the commands whose work is stored as it goes (their studies' trials) and taken up again by the
# same command: a Ctrl-C says so; the others say only what is true of them
RESUMING = ("moe", "gemm", "mla", "worker", "nightly", "proof")


def interrupted_keeps(command: str | None) -> str:
    """What an interrupted `command` leaves, after 'tuner: interrupted; '."""
    if command in RESUMING:
        return ("what was finished is kept (finished trials in the storage, whole files only): run the same command "
                "to resume")
    if command in ("coverage", "landscape"):       # their one file is written whole at the end
        return "nothing was written: run the command again"
    return "no file is left half-written (each is written whole, or not at all): run the command again"


# The signal that interrupted the command, noted before it is raised: an extension module whose
# import a Ctrl-C lands in (Triton's libtriton, built with pybind11) turns the KeyboardInterrupt
# into an ImportError("initialization failed"), which would otherwise read as an internal error.
_SIGNALLED: list[KeyboardInterrupt] = []


def _on_sigterm(signum, frame):
    _SIGNALLED.append(_Terminated())
    raise _SIGNALLED[-1]


def _on_sigint(signum, frame):
    _SIGNALLED.append(KeyboardInterrupt())
    raise _SIGNALLED[-1]


def _innermost_parser(parser: argparse.ArgumentParser, args) -> argparse.ArgumentParser:
    """The (sub)parser of the command line's subcommand (`tuner landscape synth`'s, say)."""
    for dest in ("command", "action"):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, dest, None)
        if not subs or name not in subs[0].choices:
            break
        parser = subs[0].choices[name]
    return parser


def _setup_logging() -> None:
    """Warnings and worse by default; TUNER_LOG=info or debug shows more (how stale trials
    were cleared, storage retries)."""
    logger = logging.getLogger("tuner")
    if not any(isinstance(h, _StderrLines) for h in logger.handlers):
        logger.addHandler(_StderrLines())
    level = os.environ.get("TUNER_LOG", "warning").upper()
    logger.setLevel(level if level in ("DEBUG", "INFO", "WARNING", "ERROR") else "WARNING")
    # SQLAlchemy logs a traceback ("Error closing cursor") when Ctrl-C or SIGTERM lands inside
    # a query; the interruption is reported in one line of ours, and a real storage error
    # still raises. TUNER_LOG=debug shows them.
    sa = logging.getLogger("sqlalchemy")
    if level != "DEBUG" and not any(isinstance(h, logging.NullHandler) for h in sa.handlers):
        sa.addHandler(logging.NullHandler())
        sa.propagate = False


def _trust_engine_source(args) -> str | None:
    """--trust-engine-source for this process and the ones it starts (measuring children,
    compile workers, the proof's steps); returns the setting to restore afterwards."""
    from tuner.plan.kernel_sources import TRUST_ENV
    before = os.environ.get(TRUST_ENV)
    if getattr(args, "trust_engine_source", False):
        os.environ[TRUST_ENV] = "1"
    return before


def _restore_streams(out, err) -> None:
    """The streams main() was given, with what was written through the fitting ones flushed."""
    for stream, raw in ((sys.stdout, out), (sys.stderr, err)):
        if stream is not raw:
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    sys.stdout, sys.stderr = out, err


def main(argv: list[str] | None = None) -> int:
    import signal

    from tuner.search import window
    started = window.now()             # a --minutes window counts from here: the command's start
    _setup_logging()
    parser = build_parser()
    from tuner.textwidth import Fitting, error_text
    previous = None
    restore_trust, trust_before = False, None
    command: str | None = None           # what an interruption says depends on it
    # every line the command prints fits 120 columns or the terminal (an error stays one line)
    raw_out, raw_err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = Fitting(raw_out), Fitting(raw_err)
    _SIGNALLED.clear()
    previous_int = None
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:     # not where SIGINT is ignored
            previous_int = signal.signal(signal.SIGINT, _on_sigint)
    except ValueError:
        pass                       # not the main thread (tests calling main in a thread)
    try:
        from tuner.commands.options import Parser
        Parser.argv = list(sys.argv[1:] if argv is None else argv)
        args, extra = parser.parse_known_args(argv)
        command = args.command
        if extra:           # said by the subcommand's parser, so that the hint names its --help
            _innermost_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
        if not args.command:
            parser.print_help()
            return 2
        args.argv = list(sys.argv[1:] if argv is None else argv)     # the command that continues a window
        args.started = started
        trust_before = _trust_engine_source(args)
        restore_trust = True
        if getattr(args, "device", None) == "cpu":
            from tuner.measure.device import prepare_process
            prepare_process("cpu")          # before any kernel is imported here
        return COMMANDS[args.command](args)
    except TunerError as e:
        _restore_streams(raw_out, raw_err)
        print(error_text(f"tuner: error: {e}", sys.stderr), file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt as e:
        what = "terminated" if isinstance(e, _Terminated) else "interrupted"
        print(f"tuner: {what}; {interrupted_keeps(command)}", file=sys.stderr)
        return 143 if isinstance(e, _Terminated) else 130
    except BrokenPipeError:
        # the reader went away (`tuner diff ... | head`): nothing left to say to anyone
        try:
            raw_out = open(os.devnull, "w")          # restored in place of the broken pipe
            sys.stdout = Fitting(raw_out)
        except OSError:
            pass
        return 0
    except Exception as e:  # noqa: BLE001 - never a traceback unless asked for
        if _SIGNALLED:               # a Ctrl-C or SIGTERM that an extension's import turned into its own error
            _restore_streams(raw_out, raw_err)
            what = "terminated" if isinstance(_SIGNALLED[-1], _Terminated) else "interrupted"
            print(f"tuner: {what}; {interrupted_keeps(command)}", file=sys.stderr)
            return 143 if what == "terminated" else 130
        if os.environ.get("TUNER_DEBUG"):
            raise
        _restore_streams(raw_out, raw_err)
        from tuner.errors import os_error_line
        line = os_error_line(e)
        if line is not None:         # a read-only folder, a full disk, a name too long, a link loop
            print(error_text(f"tuner: error: {line}", sys.stderr), file=sys.stderr)
            return 2
        print(f"tuner: internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
              "(set TUNER_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1
    finally:
        _restore_streams(raw_out, raw_err)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)
        if restore_trust:
            from tuner.plan.kernel_sources import TRUST_ENV
            if trust_before is None:
                os.environ.pop(TRUST_ENV, None)
            else:
                os.environ[TRUST_ENV] = trust_before


def entry() -> int:
    """The `tuner` command (and `python -m tuner`): main(), after which the exit's cleanup
    (ending measuring children, Python's resource tracker) runs with SIGINT and SIGTERM
    ignored: the command's work is done and said, and a Ctrl-C landing then must neither
    print a traceback nor turn its exit status into a death by signal."""
    import signal
    code = main()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            signal.signal(sig, signal.SIG_IGN)
        except ValueError:
            pass                       # not the main thread
    return code
