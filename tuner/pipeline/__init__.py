"""The tuning pipeline: one request from start to files.

A request (request.py, checked as it is made) is planned (planning.py: model, GPU, problems,
kernels, spaces, warm starts; one plan per kernel, run_plan.py; the dry run's text,
plan_text.py), then each plan is run (run.py): its studies (studies.py, here or in one worker
per GPU, the plan kept in the storage: stored_plans.py), then collected into each engine's
tables and the manifest (emission.py). tune.py ties it together. Below the commands, above
plan/, measure/, search/ and emit/, whose parts it calls in order (docs/architecture.md).
"""
