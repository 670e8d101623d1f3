"""The official `openai` Python client against `llada-rt serve` on the embedded model: chat,
streamed and not, gives the text `llada-rt run` gives for the same settings; `extra_body`
diffusion settings take effect; bad requests raise the client's error for their status.

usage: python openai_client.py LLADA_RT ARTIFACT [serve args...]   (exit status 0: all held)
"""

import sys

import openai

from server import Server, run_text

FILL = "FILL:3000705000000920000040015000608000070060300000004000000800900010="


def main():
    binary, artifact, *serve_args = sys.argv[1:]
    # `run` on the server's backend, so the texts compare like with like.
    backend = serve_args[serve_args.index("--backend"):][:2] if "--backend" in serve_args else []
    checks = 0
    with Server(binary, artifact, "--api-key", "k", *serve_args) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
        model = client.models.list().data[0].id
        for extra, args in [
            ({"steps": 64}, ["--gen-len", "64", "--steps", "64"]),
            ({"steps": 16, "policy": "dual"}, ["--gen-len", "64", "--steps", "16", "--policy", "dual"]),
            ({"steps": 32, "policy": "mbsd"}, ["--gen-len", "64", "--steps", "32", "--policy", "mbsd"]),
        ]:
            text, passes = run_text(binary, artifact, FILL, *args, *backend)
            msgs = [{"role": "user", "content": FILL}]
            r = client.chat.completions.create(model=model, messages=msgs, max_tokens=64, extra_body=extra)
            got = r.choices[0].message.content
            assert got == text, f"{extra}: {got!r} != run's {text!r}"
            llada = r.model_extra["llada"]
            assert llada["forward_passes"] == passes, f"{extra}: {llada['forward_passes']} passes, run made {passes}"
            stream = client.chat.completions.create(model=model, messages=msgs, max_tokens=64, stream=True, extra_body=extra)
            pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
            assert "".join(pieces) == text, f"{extra}: streamed {''.join(pieces)!r} != {text!r}"
            print(f"chat {extra}: {text!r} in {passes} passes, the same streamed ({sum(1 for p in pieces if p)} text chunks)")
            checks += 2
        r = client.completions.create(model=model, prompt="REVERSE:ABCD=", max_tokens=16, extra_body={"steps": 16})
        assert r.choices[0].text is not None
        checks += 1
        for what, call, error in [
            ("max_tokens out of range", lambda: client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], max_tokens=100000), openai.BadRequestError),
            ("a diffusion setting out of range", lambda: client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], extra_body={"threshold": 7}), openai.BadRequestError),
            ("a wrong type", lambda: client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], extra_body={"steps": "many"}), openai.BadRequestError),
            ("an unknown model", lambda: client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}]), openai.NotFoundError),
            ("an unsupported field", lambda: client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], logprobs=True), openai.BadRequestError),
            ("a wrong API key", lambda: openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0).models.list(), openai.AuthenticationError),
        ]:
            try:
                call()
            except error as e:
                print(f"{what}: {type(e).__name__} {e.status_code}: {e.message}")
                checks += 1
            else:
                raise AssertionError(f"{what}: no error")
        status = server.stop()
        assert status == 0, f"serve exited with {status} after SIGTERM"
    print(f"openai client: {checks} checks passed")


if __name__ == "__main__":
    main()
