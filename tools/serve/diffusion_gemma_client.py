"""The official `openai` Python client against `llada-rt serve` on DiffusionGemma (the conformance
kit's tiny checkpoint): chat, streamed and not, gives the text `llada-rt run --chat` gives for the
same settings (PyTorch's random stream and a seed, so the two runs draw the same noise);
DiffusionGemma's settings go through `extra_body` ("none" turns a part off); LLaDA's are refused
with the client's error for a 400, naming the setting.

usage: python diffusion_gemma_client.py LLADA_RT ARTIFACT   (exit status 0: all held)
"""

import sys

import openai

from server import Server, run_text

PROMPT = "hello there"


def main():
    binary, artifact = sys.argv[1:]
    checks = 0
    with Server(binary, artifact, "--api-key", "k") as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
        model = client.models.list().data[0].id
        msgs = [{"role": "user", "content": PROMPT}]
        for extra, args in [
            ({"rng": "torch", "seed": 3}, ["--gen-len", "32", "--rng", "torch", "--seed", "3"]),
            ({"rng": "torch", "seed": 7, "t_min": "none", "entropy_bound": 0.5, "steps": 8}, ["--gen-len", "32", "--rng", "torch", "--seed", "7", "--t-min", "none", "--entropy-bound", "0.5", "--steps", "8"]),
            ({"seed": 5, "stability_threshold": "none", "eos_ids": "none"}, ["--gen-len", "32", "--seed", "5", "--stability-threshold", "none", "--eos-ids", "none"]),
        ]:
            text, passes = run_text(binary, artifact, PROMPT, *args)
            r = client.chat.completions.create(model=model, messages=msgs, max_tokens=32, extra_body=extra)
            got = r.choices[0].message.content
            assert got == text, f"{extra}: {got!r} != run's {text!r}"
            assert r.model_extra["llada"]["forward_passes"] == passes, f"{extra}: {r.model_extra['llada']['forward_passes']} passes, run made {passes}"
            stream = client.chat.completions.create(model=model, messages=msgs, max_tokens=32, stream=True, extra_body=extra)
            pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
            assert "".join(pieces) == text, f"{extra}: streamed {''.join(pieces)!r} != {text!r}"
            print(f"chat {extra}: {passes} passes, the same text streamed ({sum(1 for p in pieces if p)} chunks)")
            checks += 1
        try:
            client.chat.completions.create(model=model, messages=msgs, max_tokens=32, extra_body={"remasking": "random"})
            raise AssertionError("a LLaDA setting was accepted")
        except openai.BadRequestError as e:
            assert "remasking" in str(e), e
            print("remasking refused:", e.body["message"][:80])
            checks += 1
    print(f"{checks} checks held")


if __name__ == "__main__":
    main()
