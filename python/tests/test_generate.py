import threading
from pathlib import Path

import pytest

import llada

FILL = "FILL:3000705000000920000040015000608000070060300000004000000800900010="
# README: `llada-rt run llada-tiny.lad --chat -p "FILL:..." --gen-len 64 --steps 64` prints it.
FILL_ANSWER = "3333775555555922222244415555668888877766333333334444444888999911"


def test_model_properties(tiny, tiny_path):
    assert tiny.path == str(tiny_path)
    assert tiny.family == "llada"
    assert tiny.max_len >= 64
    ids = tiny.encode_chat(FILL)
    assert tiny.decode(ids, skip_special=False).endswith("\n\n")
    assert FILL in tiny.decode(ids)
    assert tiny.decode(tiny.encode("1234")) == "1234"


def test_readme_fill_answer(tiny):
    s = tiny.session()
    g = s.generate(FILL, chat=True, gen_len=64, steps=64)
    assert g["text"] == FILL_ANSWER
    assert len(g["output_ids"]) == 64
    assert g["prompt_ids"] == tiny.encode_chat(FILL)
    assert len(g["reveals"]) == 64 and all(len(r) == 1 for r in g["reveals"])
    assert g["revisions"] is None
    assert g["forward_passes"] > 0 and g["rows_computed"] > 0 and g["seconds"] > 0
    assert g["counters"]["forward_passes"] == g["forward_passes"]
    assert s.counters["forward_passes"] == g["forward_passes"]


def test_steps_match_generate_and_stop_early(tiny):
    s = tiny.session(threads=1)
    settings = dict(gen_len=32, steps=16, block_len=16)
    ids = tiny.encode_chat("REVERSE:ABCDEFG=")
    want = s.generate(ids=ids, **settings)

    it = s.steps(ids=ids, **settings)
    views = list(it)
    assert [v["step"] for v in views] == list(range(1, len(views) + 1))
    assert views[-1]["steps"] == len(views) == len(want["reveals"])
    last = views[-1]
    assert last["generated"] == want["output_ids"]
    assert tiny.mask_id not in last["generated"]
    assert [v["committed"] for v in views] == want["reveals"]
    assert last["settled"] == 32
    assert last["settled_text"] == want["text"]
    assert it.result["output_ids"] == want["output_ids"]
    # An open position shows the mask until a step commits it.
    assert views[0]["generated"].count(tiny.mask_id) == 32 - len(views[0]["committed"])

    # Stopped part-way: the session is busy while the iterator is open, usable once it is
    # dropped (or closed), and the next generation starts afresh.
    it = s.steps(ids=ids, **settings)
    next(it)
    next(it)
    with pytest.raises(llada.LladaError, match="busy"):
        s.generate(ids=ids, **settings)
    del it
    assert s.generate(ids=ids, **settings)["output_ids"] == want["output_ids"]
    it = s.steps(ids=ids, **settings)
    next(it)
    it.close()
    assert list(it) == []
    assert s.generate(ids=ids, **settings)["output_ids"] == want["output_ids"]


def test_bad_settings_name_the_setting(tiny):
    s = tiny.session(threads=1)
    with pytest.raises(ValueError, match="--gen-len"):
        s.generate("1234", gen_len=100000)
    with pytest.raises(ValueError, match="gen_lenn"):
        s.generate("1234", gen_lenn=8)
    with pytest.raises((TypeError, ValueError), match="steps"):
        s.generate("1234", steps="8")
    with pytest.raises(TypeError, match="temperature"):
        s.generate("1234", temperature=[0.5])
    with pytest.raises(ValueError, match="--backend"):
        tiny.session(backend="tpu")
    with pytest.raises(ValueError, match="--threads"):
        tiny.session(threads=0)
    with pytest.raises(ValueError, match="--quant"):
        llada.compile("nowhere", "nowhere.lad", quant="q3")
    # lladac compile's NPU plan flags are keywords too, refused off a Snapdragon target as there.
    with pytest.raises(llada.SettingError, match="--npu-sessions"):
        llada.compile(Path(__file__).resolve().parents[2] / "models" / "llada-tiny-tasks", "never.lad", npu_sessions=1)
    # The settings errors are llada's own ValueError, and the session is still usable.
    with pytest.raises(llada.SettingError):
        s.steps("1234", gen_len=100000)
    assert len(s.generate("1234", gen_len=8, block_len=8, steps=8)["output_ids"]) == 8


def test_missing_artifact(tmp_path):
    missing = tmp_path / "missing.lad"
    with pytest.raises(OSError, match="missing.lad") as e:
        llada.Model(missing)
    assert isinstance(e.value, FileNotFoundError)
    with pytest.raises(FileNotFoundError, match="no-such-checkpoint"):
        llada.compile(tmp_path / "no-such-checkpoint", tmp_path / "out.lad")


def test_threads_generate_concurrently(tiny):
    # Each thread on its own session; the passes run without the GIL.
    sessions = [tiny.session(threads=1) for _ in range(2)]
    ids = tiny.encode_chat(FILL)
    results = [None, None]
    errors = []

    def work(i):
        try:
            results[i] = sessions[i].generate(ids=ids, gen_len=64, steps=64)["text"]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors
    assert results == [FILL_ANSWER, FILL_ANSWER]


def test_ctrl_c_stops_generate_between_steps_and_the_session_goes_on(tiny):
    import os
    import signal

    s = tiny.session(threads=1)
    # A process started with SIGINT ignored (a background job of a non-interactive shell, as
    # scripts often start CI steps) inherits that and never gets KeyboardInterrupt: this test
    # is about the generation's check, so it gives itself Python's own handler.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    # A long generation (384 passes, seconds; 4,096 steps over 128 tokens are only 128 passes,
    # under a second); SIGINT arrives while it runs.
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            s.generate(FILL, chat=True, gen_len=384, steps=384)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    passes = s.counters["forward_passes"]
    assert 0 < passes < 384, passes
    assert s.generate(FILL, chat=True, gen_len=64, steps=64)["text"] == FILL_ANSWER


def test_session_options_are_run_s_session_flags(tiny, tmp_path):
    # A dense model: staging either way gives the same answer; expert settings are refused by flag.
    ids = tiny.encode_chat(FILL)
    answers = {st: tiny.session(staging=st).generate(ids=ids, gen_len=64, steps=64)["text"] for st in ("async", "sync")}
    assert answers == {"async": FILL_ANSWER, "sync": FILL_ANSWER}
    with pytest.raises(llada.SettingError, match="--staging"):
        tiny.session(staging="later")
    with pytest.raises(llada.SettingError, match="--experts"):
        tiny.session(experts="lru")
    with pytest.raises(llada.SettingError, match="--experts"):
        tiny.session(experts="sometimes")
    # A mixture-of-experts model (LLaDA 2.x's kit): every expert strategy gives the same tokens.
    kit = Path(__file__).resolve().parents[2] / "tests" / "data" / "llada2-conformance" / "tiny-llada2"
    llada.compile(kit, tmp_path / "moe.lad")
    moe = llada.Model(tmp_path / "moe.lad")
    settings = dict(gen_len=40, block_len=16, steps=16, threshold=0.5)
    want = moe.session().generate(ids=[5, 9, 200, 31, 77], **settings)["output_ids"]
    for experts, cpu_threads in (("hybrid", None), ("lru", None), ("static", 2)):
        got = moe.session(experts=experts, cpu_threads=cpu_threads).generate(ids=[5, 9, 200, 31, 77], **settings)["output_ids"]
        assert got == want, experts
    with pytest.raises(llada.SettingError, match="--cpu-threads"):
        moe.session(experts="static", cpu_threads=0)
