"""Greedy cases of the published Dream sampler with its top_p and top_k filters (which change the
probabilities a confidence is taken from), written as `filtered.json` beside the kit's golden.json:

    python tools/dream/make_filtered.py --modeling DIR_WITH_PUBLISHED_FILES \
        --checkpoint tests/data/dream-conformance/tiny-dream-A

Each case: the golden case it starts from (prompt, length, steps, alg), top_p, top_k, and the published
`diffusion_generate`'s output ids at temperature 0.
"""

import argparse
import contextlib
import io
import json
import os

import torch

from dream_public import load_public_code


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--modeling", required=True)
    a.add_argument("--checkpoint", required=True)
    args = a.parse_args()
    torch.set_num_threads(1)
    modeling, _, _ = load_public_code(args.modeling)
    model = modeling.DreamModel.from_pretrained(args.checkpoint, torch_dtype=torch.float32).eval()
    golden = json.load(open(os.path.join(args.checkpoint, "golden.json")))
    cases = []
    for case in golden["cases"][:48:8]:
        for top_p, top_k in [(0.9, None), (None, 5), (0.8, 3)]:
            x = torch.tensor([case["prompt_ids"]])
            with contextlib.redirect_stdout(io.StringIO()):  # the vendored _sample prints
                out = model.diffusion_generate(
                    x, max_new_tokens=case["gen_length"], steps=case["steps"], alg=case["alg"], alg_temp=None,
                    temperature=0.0, top_p=top_p, top_k=top_k, eps=case["eps"], return_dict_in_generate=True,
                )
            cases.append({
                "id": f"{case['id']}_p{top_p}_k{top_k}", "prompt_ids": case["prompt_ids"], "gen_length": case["gen_length"],
                "steps": case["steps"], "alg": case["alg"], "eps": case["eps"], "top_p": top_p, "top_k": top_k,
                "output_ids": out.sequences[0].tolist()[len(case["prompt_ids"]):],
            })
    path = os.path.join(args.checkpoint, "filtered.json")
    json.dump({"torch_version": torch.__version__, "temperature": 0.0, "cases": cases}, open(path, "w"), indent=1)
    print(f"wrote {path}: {len(cases)} cases")


if __name__ == "__main__":
    main()
