"""The option helpers every command's parser shares: argparse types that say what a bad value
should be (one line, exit 2), --device and --trust-engine-source. The command line (tuner/cli.py)
and each command module build their parsers from these; nothing here imports a command."""

from __future__ import annotations

import argparse

from tuner.errors import TunerError
from tuner.pipeline.request import MAX_CONTEXT, MAX_COUNT, MAX_PAGE, MAX_PARALLEL, MAX_WORKERS


class Parser(argparse.ArgumentParser):
    # the command line being parsed (tuner/cli.py sets it): argparse says a required option is
    # missing before it says which given ones it did not know, so a misspelt --modle read as
    # "the following arguments are required: --model" alone
    argv: list[str] = []

    def error(self, message: str):  # one line, not argparse's usage block
        if message.startswith("the following arguments are required"):
            unknown = self._unknown_given()
            if unknown:
                message += f"; not an option here: {', '.join(unknown)}"
        if message.startswith(("the following arguments are required", "unrecognized arguments")):
            message += self._did_you_mean()
        raise TunerError(f"{message} (see `{self.prog} --help`)")

    def _unknown_given(self) -> list[str]:
        """The --options given that this parser knows neither whole nor as a prefix (argparse takes
        an unambiguous prefix: --mod is --model)."""
        given = [a.split("=", 1)[0] for a in Parser.argv if a.startswith("--")]
        return [a for a in given if not any(k.startswith(a) for k in self._option_string_actions)]

    def _did_you_mean(self) -> str:
        import difflib
        unknown = self._unknown_given()
        near = difflib.get_close_matches(unknown[0], list(self._option_string_actions), n=1) if unknown else []
        return f" (did you mean {near[0]}?)" if near else ""

    def format_help(self) -> str:
        # the description wrapped as usual; the epilog (the examples) kept line by line
        epilog, self.epilog = self.epilog, None
        try:
            text = super().format_help()
        finally:
            self.epilog = epilog
        return text + (f"\n{epilog}\n" if epilog else "")


def integer(lo: int, hi: int, power_of_two: bool = False, why: str = ""):
    """An argparse type: an integer in [lo, hi] (and a power of two where asked)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be from {lo} to {hi}: {v}{why}")
        if power_of_two and v & (v - 1):
            raise argparse.ArgumentTypeError(f"must be a power of two: {v}{why}")
        return v
    return parse


def fraction(text: str) -> float:
    """A relative noise band: a number from 0 up to (not including) 1."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= v < 1:                    # NaN fails this too
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1 (0.02 is 2%): {text}")
    return v


def minutes(text: str) -> float:
    """--minutes: a window's length, more than 0 and at most a day."""
    from tuner.pipeline.request import checked_minutes
    try:
        return checked_minutes(text)
    except TunerError as e:
        raise argparse.ArgumentTypeError(str(e).replace("--minutes must", "must")) from None


# the bounds a tuning request holds every way it is made (tuner/pipeline/request.py)
positive = integer(1, MAX_COUNT)
batch = integer(1, MAX_COUNT, why=" (batch sizes are tokens per step)")
parallel = integer(1, MAX_PARALLEL)
workers = integer(0, MAX_WORKERS)
page = integer(1, MAX_PAGE, power_of_two=True, why=" (the KV cache block size of vLLM and SGLang)")
context = integer(1, MAX_CONTEXT)
SEED_MAX = (1 << 32) - 1
seed = integer(0, SEED_MAX, why=" (what every sampler's random generator and the numerics' inputs take)")


def triton_version(text: str) -> str:
    """--triton: a Triton release as triton.__version__ names it (X.Y.Z, a pre-release or a local
    build's +suffix after it); X.Y is X.Y.0, since SGLang's loader names its folder from the whole
    version (triton_3_6_0/, tuner/plan/engine_rules/schema.py triton_folder): read as 3.6, a 3.6.0
    table would be taken for another Triton's."""
    from tuner.plan.engine_rules.schema import checked_triton
    try:
        return checked_triton(text)
    except TunerError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


DEVICE_HELP = ("what measures: cuda (default), the GPU; cpu, the CPU device: the GPU's whole code path (measuring "
               "child, compile workers compiling for sm_90, timeouts, numerics, tables) run on a CPU in Triton's "
               "interpreter, for CI and rehearsals; its times are labelled CPU DEVICE and mean nothing about a GPU")


def device_option(group, default: str | None = "cuda", extra: str = "") -> None:
    group.add_argument("--device", choices=("cuda", "cpu"), default=default, help=DEVICE_HELP + extra)


def trust_option(p) -> None:
    p.add_argument("--trust-engine-source", action="store_true",
                   help="timing an engine's kernel imports code from the engine's files (--engine-source, the "
                   "installed engine, $TUNER_ENGINE_WHEELS): files that match none of the releases tuner knows "
                   "are refused unless you trust their source and say so with this flag")


TP_HELP = ("tensor-parallel size (default: the smallest power of two up to 8 whose GPUs hold the weights with room "
           "for the KV cache, said in the first line); a --tp whose GPUs cannot hold them is refused")
PER_RANK_HELP = ("--tp (and --ep) describe one rank's shapes of a deployment you size yourself (several nodes, "
                 "data-parallel attention): take them even where --tp GPUs alone cannot hold the weights")


def parallel_options(group) -> None:
    """--tp (default: the deployment that serves the model, tuner/plan/deployment.py), --ep, --per-rank."""
    group.add_argument("--tp", type=parallel, default=None, help=TP_HELP)
    group.add_argument("--ep", type=parallel, default=1, help="expert-parallel size (default 1)")
    group.add_argument("--per-rank", action="store_true", help=PER_RANK_HELP)


