"""What comes out.

In: finished studies. Out: each engine's tables exactly as it reads them, the manifest,
installs into an engine, and the audit of the tables an engine will really read.
"""
