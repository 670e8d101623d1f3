"""Issue 58's rules every front end shares, through Python: seeds take every u64 and whole
numbers out of range name the setting and its range; decode refuses ids it does not know; a
long prompt is tokenized without the GIL and one too long for the model is refused at once;
a forked child is refused its parent's models and sessions instead of hanging."""
import os
import select
import threading
import time

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


def test_decode_refuses_an_unknown_id_by_name(tiny):
    ids = tiny.encode("1234")
    assert tiny.decode(ids) == "1234"
    with pytest.raises(ValueError, match="token id 99999 \\(at 1\\)"):
        tiny.decode([ids[0], 99999])
    with pytest.raises(llada.SettingError, match="99999"):
        tiny.decode([99999])


def test_a_prompt_too_long_for_the_model_is_refused_at_once(tiny):
    s = tiny.session(threads=1)
    big = "1" * (10 << 20)
    start = time.monotonic()
    for call in [lambda: s.generate(big, **SHORT), lambda: s.steps(big, **SHORT), lambda: s.generate(big, chat=True, **SHORT)]:
        with pytest.raises(llada.SettingError, match=f"the prompt is {10 << 20} bytes"):
            call()
    assert time.monotonic() - start < 1.0
    # One that may fit is tokenized, and refused for its tokens if they do not.
    with pytest.raises(llada.SettingError):
        s.generate("12 " * tiny.max_len, **SHORT)


def test_long_tokenization_releases_the_gil(tiny):
    def encode_beside(text):
        """How long `tiny.encode(text)` took on a thread, and the longest this thread waited
        between two of its own short sleeps meanwhile."""
        took = []

        def encode():
            t = time.monotonic()
            tiny.encode(text)
            took.append(time.monotonic() - t)

        worker = threading.Thread(target=encode)
        gaps, last = [0.0], time.monotonic()
        worker.start()
        while worker.is_alive():
            now = time.monotonic()
            gaps.append(now - last)
            last = now
            time.sleep(0.001)
        worker.join()
        return took[0], max(gaps)

    # Long enough to tell (3 MB, larger on a fast machine).
    for size in [1 << 18, 1 << 20, 1 << 22]:
        took, gap = encode_beside("12 34 56 78 " * size)
        if took > 0.2:
            break
    assert took > 0.2, f"the encode is too quick to tell ({took:.3f} s)"
    # With the GIL held, this thread would stall for the whole encode; without it, for no
    # more than a switch interval or two.
    assert gap < took / 2, f"the main thread stalled {gap:.3f} s of a {took:.3f} s encode"


def in_child(work, timeout=60.0):
    """Runs `work` in a forked child; what it returns (a string) or raises, or "hung"."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            out = "ok: " + str(work())
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            out = f"{type(e).__name__}: {e}"
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    ready, _, _ = select.select([r], [], [], timeout)
    out = os.read(r, 1 << 16).decode() if ready else "hung"
    os.close(r)
    if not ready:
        os.kill(pid, 9)
    os.waitpid(pid, 0)
    return out


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_forked_child_is_refused_its_parents_session_and_can_open_its_own(tiny, tiny_path):
    s = tiny.session(threads=2)
    want = s.generate("1234", **SHORT)["output_ids"]
    parent = os.getpid()
    for what, work in [
        ("generate", lambda: s.generate("1234", **SHORT)),
        ("steps", lambda: s.steps("1234", **SHORT)),
        ("counters", lambda: s.counters),
        ("model", lambda: tiny.session()),
        ("encode", lambda: tiny.encode("1234")),
    ]:
        out = in_child(work)
        assert out.startswith("LladaError: ") and f"opened in process {parent}; open it again in this process" in out, f"{what}: {out}"
        assert issubclass(llada.LladaError, RuntimeError)
    # A step iterator open across the fork: refused in the child, still the parent's.
    it = s.steps("1234", **SHORT)
    next(it)
    out = in_child(lambda: next(it))
    assert "opened in process" in out, out
    it.close()
    # Opened again in the child, a model and a session work there.
    out = in_child(lambda: llada.Model(tiny_path).session(threads=2).generate("1234", **SHORT)["output_ids"])
    assert out == f"ok: {want}", out
    # And the parent's session is untouched.
    assert s.generate("1234", **SHORT)["output_ids"] == want
