"""Issue 58's rules every front end shares, through Python: seeds take every u64 and whole
numbers out of range name the setting and its range."""
import pytest

import llada

SHORT = dict(gen_len=8, block_len=8, steps=8)
U64_MAX = 2**64 - 1


def test_seeds_take_every_u64_and_out_of_range_names_the_setting_and_range(tiny):
    s = tiny.session(threads=1)
    for seed in [0, 2**63, U64_MAX]:
        assert len(s.generate("1234", temperature=0.5, seed=seed, **SHORT)["output_ids"]) == 8
    # The same seed, the same output, at the top of the range too.
    a = s.generate("1234", temperature=0.9, seed=U64_MAX, **SHORT)["output_ids"]
    assert s.generate("1234", temperature=0.9, seed=U64_MAX, **SHORT)["output_ids"] == a
    for seed, shown in [(2**64, "18446744073709551616"), (-1, "-1"), (-(2**63) - 1, "-9223372036854775809")]:
        with pytest.raises(llada.SettingError, match=f"^--seed {shown} is outside 0..={U64_MAX}$"):
            s.generate("1234", seed=seed, **SHORT)
    # Past any integer type: still the setting and its range, not "too large".
    with pytest.raises(llada.SettingError, match=f"^--seed 1000000000000000\\d* is outside 0..={U64_MAX}$"):
        s.generate("1234", seed=10**50, **SHORT)
    # 2^63 fits a u64: it is out of the plan's range, which the message gives.
    with pytest.raises(llada.SettingError, match="^--gen-len 9223372036854775808 is outside 1..="):
        s.generate("1234", gen_len=2**63)
    with pytest.raises(llada.SettingError, match="^--steps -1 is outside 0..="):
        s.generate("1234", gen_len=8, block_len=8, steps=-1)
