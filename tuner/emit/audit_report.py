"""`tuner audit`'s output: a terminal summary (within 120 columns or the terminal's width; whole
lines when piped, as every command's: tuner/textwidth.py), JSON and Markdown."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tuner.emit.audit import AuditReport, KernelAudit
from tuner.emit.audit_rules import KINDS, Finding, _cfg_text, m_range
from tuner.file_kinds import AUDIT_JSON, AUDIT_MD
from tuner.paths import atomic_write_json, atomic_write_text, replaceable

WIDTH = 120
EXAMPLES = 5          # findings shown per kind in the terminal (every one is in the JSON and Markdown)


def wrap(line: str, indent: str = "") -> list[str]:
    """A line as printed: wrapped to the terminal's width (at most WIDTH), whole when piped (the
    rule of every command: tuner/textwidth.py)."""
    from tuner.textwidth import output_width
    columns = output_width()
    if columns is None:
        return [line]
    return textwrap.wrap(line, min(WIDTH, columns), subsequent_indent=indent + "    ", break_on_hyphens=False,
                         break_long_words=True) or [""]


def _short(where: str) -> str:
    """A table's file as its folder and name (the package path is in the header)."""
    parts = where.replace(":", "/").split("/")
    return "/".join(parts[-2:]) if len(parts) > 1 else where


def header_lines(report: AuditReport) -> list[str]:
    h = report.header
    lines = [f"tuner audit{' --all' if report.mode == 'all' else ''}: {h['engine']} {h.get('version') or '(version unknown)'} "
             f"({h['source']}), Triton {h['triton']} ({h['triton_from']}); loader rules of {h.get('rules_of', '?')}"]
    if report.mode == "deployment":
        lines.append(f"deployment: {h['model']} on {h['gpu']}, TP{h['tp']} EP{h['ep']}, {h['dtype']}, "
                     f"batch sizes {h['batch_sizes']}")
    else:
        s = report.stats
        lines.append(f"{s.get('files', 0)} table files, {s.get('tables', 0)} loadable tables ({s.get('rows', 0)} rows), "
                     f"{s.get('other_loaders', 0)} of other kernels' loaders; batch sizes {h['batch_sizes']}")
    if h.get("override"):
        lines.append(f"override folder: {h['override']}")
    if h.get("numerics"):
        lines.append(f"numerics: {h['numerics']}")
    lines += [f"note: {n}" for n in h.get("notes", [])]
    return [w for line in lines for w in wrap(line)]


def kernel_lines(ka: KernelAudit, said: set | None = None) -> list[str]:
    """One table lookup: the file, the rows per M range, numerics, findings (a reason already
    printed for an earlier table, in `said`, is shortened to "as above")."""
    r = ka.resolved
    out = wrap(f"{ka.title}: {'read by default' if ka.reads else 'NOT read by default'}")
    if r.found:
        how = {"exact Triton folder": "", "package": "", "override folder": " (override folder)",
               "Triton fallback": f" (Triton fallback: {r.triton_folder})", "the up table": " (no _down table: the up "
               "table)"}.get(r.how, f" ({r.how})")
        out += wrap(f"  file: {ka.short}{how}", "  ")
    else:
        out += wrap(f"  file: none: {r.name}" + (f" ({r.crash})" if r.crash else ""), "  ")
    for row in ka.rows:
        ms = m_range(row["first"], row["last"])
        if row["key"] is None:
            out.append(f"  {ms:<14s} {row['runs_as']}")
            continue
        key = f"key {row['key']}" + (f" (up {row['up_key']})" if row.get("up_key") is not None else "")
        text = f"  {ms:<14s} {key:<18s} {_cfg_text(row['entry'])}"
        if row.get("changes"):
            text += "  -> runs " + _cfg_text(row["runs_as"]) + "  [" + "; ".join(row["changes"]) + "]"
        out += wrap(text, "  ")
    for c in ka.traffic:
        if c["share"] >= 0.001:
            out += wrap(f"  traffic: key {c['key']} serves {m_range(c['first'], c['last'])}, {c['share']:.1%} of the "
                        f"passes, farthest M {c['farthest']} ({c['ratio']:.2f}x)", "  ")
    for n in ka.numerics:
        rel = f"{n['rel_error']:.2e}" if n["rel_error"] is not None else "-"
        out += wrap(f"  numerics {n['status'].upper()} key {n['key']} at M={n['M']}: rel. error {rel} ({n['detail']}; "
                     f"{n['kernel']} on {n['problem']})", "  ")
    for f in ka.findings:
        repeated = said is not None and (f.kind, f.reason) in said and f.kind in ("not_read", "no_table")
        out += wrap(f"  {f.severity}: {f.kind}: {'as above' if repeated else f.reason}", "  ")
        if said is not None:
            said.add((f.kind, f.reason))
    return out


def summary_lines(report: AuditReport) -> list[str]:
    counts = {s: sum(f.severity == s for f in report.findings) for s in ("error", "warning", "info")}
    out = [f"findings: {counts['error']} error, {counts['warning']} warning, {counts['info']} info"]
    for kind, sev, fs in report.by_kind():
        tables = len({f.table for f in fs})
        rows = sum(len(f.rows) for f in fs)
        out += wrap(f"{sev:<8s}{kind:<22s}{tables:>5d} table{'s' if tables != 1 else ' '}"
                     + (f" {rows:>5d} rows" if rows else " " * 11) + f"  {KINDS.get(kind, kind)}", " " * 8)
        if report.mode == "all":
            for f in fs[:EXAMPLES]:
                out += wrap(f"          {_short(f.table)}: {f.reason}", " " * 10)
            if len(fs) > EXAMPLES:
                out.append(f"          ... {len(fs) - EXAMPLES} more (--out DIR writes every one)")
    out.append(f"exit status {report.exit_code}: " + (
        "error findings (wrong results, a loader crash, or rows no GPU timed)" if report.exit_code else "no error finding"))
    return out


def terminal_lines(report: AuditReport) -> list[str]:
    lines = header_lines(report) + [""]
    said: set = set()
    for ka in report.kernels:
        lines += kernel_lines(ka, said) + [""]
    loose = [f for f in report.findings if not any(f in ka.findings for ka in report.kernels)]
    if report.mode == "deployment" and loose:
        lines += [w for f in loose for w in wrap(f"{f.severity}: {f.kind}: {f.reason}")] + [""]
    return lines + summary_lines(report)


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _dash(value) -> str:
    return "-" if value is None else str(value)


def _md_table(header: list[str], rows: list[list]) -> list[str]:
    """A Markdown table and the blank line after it; nothing when there are no rows."""
    if not rows:
        return []
    return (["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
            + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows] + [""])


def markdown(report: AuditReport) -> str:
    h = report.header
    out = [f"# tuner audit{' --all' if report.mode == 'all' else ''}: {h['engine']} {h.get('version') or '?'}", ""]
    out += [f"- {line}" for line in header_lines(report)] + [""]
    counts = {s: sum(f.severity == s for f in report.findings) for s in ("error", "warning", "info")}
    out += [f"**{counts['error']} error, {counts['warning']} warning, {counts['info']} info; exit status "
            f"{report.exit_code}.**", ""]
    if report.kernels:
        out += ["## Tables the deployment reads", ""]
        for ka in report.kernels:
            out += [f"### {_md_cell(ka.title)}", "", f"- file: `{ka.where}` ({ka.resolved.how})",
                    f"- {'read by default' if ka.reads else 'not read by default'}: {_md_cell(ka.reads_why)}", ""]
            if ka.rows:
                out += ["| M | key | entry | runs as | rewrites |", "| --- | --- | --- | --- | --- |"]
                for row in ka.rows:
                    out.append(f"| {m_range(row['first'], row['last'])} | {row['key'] if row['key'] is not None else '-'} "
                               f"| {_md_cell(_cfg_text(row['entry']) if row['entry'] is not None else '-')} "
                               f"| {_md_cell(_cfg_text(row['runs_as']) if isinstance(row['runs_as'], dict) else row['runs_as'])} "
                               f"| {_md_cell('; '.join(row.get('changes') or []))} |")
                out.append("")
            out += _md_table(["key", "serves M", "share of passes", "farthest M"],
                             [[c["key"], m_range(c["first"], c["last"]) if c["first"] is not None else "-",
                               f"{c['share']:.2%}", f"{_dash(c['farthest'])} ({c['ratio']:.2f}x)"] for c in ka.traffic])
            out += _md_table(["key", "M", "status", "rel. error", "kernel", "problem"],
                             [[n["key"], n["M"], n["status"], _dash(n["rel_error"]), n["kernel"], n["problem"]]
                              for n in ka.numerics])
    out += ["## Findings by kind", ""]
    for kind, sev, fs in report.by_kind():
        out += [f"### {sev}: {kind} ({len({f.table for f in fs})} tables)", "", KINDS.get(kind, kind), "",
                "| severity | table | rows | reason |", "| --- | --- | --- | --- |"]
        out += [f"| {f.severity} | `{_md_cell(f.table)}` | {', '.join(map(str, f.rows))} | {_md_cell(f.reason)} |"
                for f in fs]
        out.append("")
    return "\n".join(out) + "\n"


def write_outputs(report: AuditReport, out_dir: Path) -> tuple[Path, Path]:
    """audit.json and audit.md in `out_dir`, each written atomically."""
    out_dir = Path(out_dir)
    json_path, md_path = out_paths(out_dir)
    for path, kind in ((json_path, AUDIT_JSON), (md_path, AUDIT_MD)):      # both checked before either is written
        replaceable(path, kind, f"--out {out_dir}: {path.name}")
    atomic_write_json(json_path, report.as_dict(), indent=2, root=out_dir, kind=AUDIT_JSON)
    atomic_write_text(md_path, markdown(report), root=out_dir, kind=AUDIT_MD)
    return json_path, md_path


def out_paths(out_dir: Path) -> tuple[Path, Path]:
    return out_dir / "audit.json", out_dir / "audit.md"


def check_out(out_dir: Path) -> None:
    """Before the audit: --out can be written, and its audit.json and audit.md, where there,
    are an audit's (a folder the user named: nothing else there is replaced)."""
    from tuner.paths import check_writable
    check_writable(out_dir, "--out")
    for path, kind in zip(out_paths(out_dir), (AUDIT_JSON, AUDIT_MD)):
        replaceable(path, kind, f"--out {out_dir}: {path.name}")


__all__ = ["Finding", "terminal_lines", "markdown", "wrap", "write_outputs"]
