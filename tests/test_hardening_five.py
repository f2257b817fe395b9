"""Round five of the attacker's cases (issue 42, items 5 to 8) outside install: expert ids out of
range, a journal with a damaged tail, a damaged SQLite storage, refusals that write, and
temporaries left behind."""

import numpy as np
import pytest

from tuner.errors import TunerError
from tuner.plan import routing as rt


@pytest.mark.parametrize("ids,dtype", [([[2 ** 32 + 1, 2]], np.int64), ([[2 ** 63, 1]], np.uint64),
                                       ([[2 ** 31, 1]], np.int64), ([[-2, 1]], np.int64)],
                         ids=["2^32+1", "uint64 2^63", "2^31", "-2"])
def test_expert_ids_out_of_range_are_refused(tmp_path, ids, dtype):
    """Before: 2^32 + 1 read as 1 (an int32 cast) and the file got the valid one's digest;
    uint64 2^63 read as 0."""
    np.save(tmp_path / "r.npy", np.array(ids, dtype=dtype))
    with pytest.raises(TunerError, match="is out of range"):
        rt.load_routing(tmp_path / "r.npy")
