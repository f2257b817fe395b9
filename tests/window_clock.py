"""A clock for --minutes windows that the test drives (tuner/search/window.py `now`): each config
measured costs `config_s`, each measuring worker started `startup_s`, each proposal of the default
sampler `sampler_s` (the search's own time). Where a window closes then never depends on how fast or
idle the machine is; the deadline's real-time alarm is off under it."""

import contextlib

import pytest


class Clock:
    def __init__(self, config_s=1.0, startup_s=0.0, sampler_s=0.0):
        self.t, self.config_s, self.startup_s, self.sampler_s = 0.0, config_s, startup_s, sampler_s

    def __call__(self):
        return self.t


@pytest.fixture
def clock(monkeypatch):
    import tuner.search.window as window
    from tuner.measure import measurers
    from tuner.pipeline import run
    from tuner.search import surrogate
    c = Clock()
    real_measure, real_make, real_sample = (measurers.ReplayMeasurer.measure, run.make_measurer,
                                            surrogate.CandidateGPSampler.sample_relative)

    def measure(self, problem, M, configs):
        c.t += c.config_s * len(configs)
        return real_measure(self, problem, M, configs)

    def make(opts, progress):
        c.t += c.startup_s
        return real_make(opts, progress)

    def sample(self, study, trial, space):
        c.t += c.sampler_s
        return real_sample(self, study, trial, space)

    monkeypatch.setattr(measurers.ReplayMeasurer, "measure", measure)
    monkeypatch.setattr(run, "make_measurer", make)
    monkeypatch.setattr(surrogate.CandidateGPSampler, "sample_relative", sample)
    monkeypatch.setattr(window, "now", c)
    # the deadline's alarm rings on the real clock: off under this one (a loaded machine must not cut a batch)
    monkeypatch.setattr(window.Window, "alarm", lambda self: contextlib.nullcontext())
    return c
