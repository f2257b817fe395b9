"""`tuner report` and `tuner diff`: their options into a ReportRequest or a DiffRequest, run by
tuner.api.report and tuner.api.diff (tuner/jobs/report.py)."""

from __future__ import annotations

from tuner.commands.options import fraction


def add_report_parser(sub, common) -> None:
    """`tuner report` and its options."""
    rep = sub.add_parser("report", help="tables and plots of a results folder; a bench file's verdict",
                         description="Print a results folder's tuned times and speedups, and write a Markdown "
                         "report with plots (RUN/report/report.md). Given a bench file (tuner bench's JSON): "
                         "the fastest contender per M and the backend flag each engine should run.")
    rep.add_argument("run", help="a results folder (with manifest.json), or a bench file")
    rep.add_argument("--out", default=None, metavar="FILE", help="where the Markdown goes")
    rep.add_argument("--traffic", default=None, metavar="FILE",
                     help="a traffic profile (a vLLM/SGLang /metrics dump, or a CSV/JSON of M,weight) to judge the "
                     "tables by (default: the one the run was tuned for, if any)")
    rep.add_argument("--model", default=None,
                     help="the model whose layer counts give the per-pass estimate (default: the run's)")


def add_diff_parser(sub, common) -> None:
    """`tuner diff` and its options."""
    dif = sub.add_parser("diff", help="compare two results folders",
                         description="Per problem and M: old time, new time, change, and whether it is "
                         "beyond noise; writes a Markdown report with plots.")
    dif.add_argument("old")
    dif.add_argument("new")
    dif.add_argument("--out", default=None, metavar="DIR", help="where diff.md and plots go (default NEW/diff)")
    dif.add_argument("--noise", type=fraction, default=0.02, help="smallest change that counts (default 0.02 = 2%%)")
    dif.add_argument("--force", action="store_true",
                     help="compare runs that share no problem, or replace a diff.md of another comparison")
    dif.add_argument("--traffic", default=None, metavar="FILE",
                     help="a traffic profile to judge the change by (default: the one NEW, else OLD, was tuned for)")
    dif.add_argument("--model", default=None,
                     help="the model whose layer counts give the per-pass estimate (default: the runs')")


def run_report(args) -> int:
    from tuner import api
    from tuner.jobs.requests import ReportRequest, request_of
    return api.report(request_of(ReportRequest, args))


def run_diff(args) -> int:
    from tuner import api
    from tuner.jobs.requests import DiffRequest, request_of
    return api.diff(request_of(DiffRequest, args))
