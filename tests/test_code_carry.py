"""Code versions carried over (tuner/plan/code_carry.py, configs/carried_code_versions.yaml)."""

import pytest

from tuner.errors import TunerError
from tuner.plan import code_carry
from tuner.search.identity import identity_differences


@pytest.fixture
def listed(tmp_path, monkeypatch):
    def write(text):
        path = tmp_path / "carried.yaml"
        path.write_text(text)
        monkeypatch.setattr(code_carry, "CARRIED", path)
        code_carry.carried.cache_clear()
        return path
    yield write
    code_carry.carried.cache_clear()


def test_a_listed_version_continues_what_its_predecessor_stored_and_nothing_else(listed):
    listed("carried:\n  bbbbbbbbbbbbbbbb: {from: aaaaaaaaaaaaaaaa, why: an edit that launches alike}\n"
           "  cccccccccccccccc: {from: bbbbbbbbbbbbbbbb, why: another}\n")
    stored = {"device": "NVIDIA H200", "code_version": "aaaaaaaaaaaaaaaa"}
    assert identity_differences(stored, {**stored, "code_version": "bbbbbbbbbbbbbbbb"}) == ""
    assert identity_differences(stored, {**stored, "code_version": "cccccccccccccccc"}) == ""     # a chain
    # the carry goes one way, and an unlisted version is another kernel's code
    assert "code_version" in identity_differences({**stored, "code_version": "bbbbbbbbbbbbbbbb"}, stored)
    assert "code_version" in identity_differences(stored, {**stored, "code_version": "dddddddddddddddd"})


@pytest.mark.parametrize("text", ["carried: [1, 2]\n", "carried:\n  nothex: {from: aaaaaaaaaaaaaaaa, why: x}\n",
                                  "carried:\n  bbbbbbbbbbbbbbbb: {from: aaaaaaaaaaaaaaaa}\n"])
def test_a_bad_list_is_one_line(listed, text):
    listed(text)
    with pytest.raises(TunerError) as e:
        code_carry.same_code("aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb")
    assert "\n" not in str(e.value)


def test_the_committed_list_reads():
    code_carry.carried.cache_clear()
    assert all(len(k) == len(v) == 16 for k, v in code_carry.carried().items())
