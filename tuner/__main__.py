from tuner.cli import entry

raise SystemExit(entry())
