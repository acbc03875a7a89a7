"""Well-formed share of a demo run's SFT and PPO policies by response length; prints one JSON line.

Is the PPO policy's lower well-formed share a length effect (longer reviews, more chances to slip)
or a worse policy at the same length? This samples both models on the same held-out prompts and
buckets the demo's ``well_formed`` (parses under the grammar) and ``repetition`` shares, as
``task.response_metrics`` defines them, by response length in words.

    python tools/wellformed_by_length.py runs/demo --prompts 2048 --temperature 1.0
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", help="a `fourfold demo` output directory (with sft/ and policy/)")
    p.add_argument("--prompts", type=int, default=2048)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=40)
    p.add_argument("--bucket", type=int, default=5, help="bucket width in words")
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)

    import torch

    from fourfold.apps.evaluation import sample_texts
    from fourfold.models.loading import load_causal_lm, load_tokenizer
    from fourfold.run.common import quiet_transformers
    from fourfold.tasks import get_task

    quiet_transformers()
    torch.set_num_threads(args.threads)
    task = get_task("review")
    tok = load_tokenizer(os.path.join(args.run_dir, "sft"))
    prompts = task.sample_prompts(args.prompts, random.Random(args.seed))
    result = {"run_dir": args.run_dir, "prompts": args.prompts, "temperature": args.temperature}
    for name in ("sft", "policy"):
        torch.manual_seed(args.seed)
        model = load_causal_lm(os.path.join(args.run_dir, name))
        texts, _ = sample_texts(model, tok, prompts, max_new_tokens=args.max_new_tokens, temperature=args.temperature)
        groups: dict[int, list[int]] = {}  # bucket start -> indices of its responses
        for i, text in enumerate(texts):
            groups.setdefault(len(text.split()) // args.bucket * args.bucket, []).append(i)
        by_length = {}
        for lo in sorted(groups):
            idx = groups[lo]
            m = task.response_metrics([prompts[i] for i in idx], [texts[i] for i in idx])
            by_length[f"{lo}-{lo + args.bucket - 1}"] = {
                "n": len(idx), "well_formed": round(m["well_formed"], 4), "repetition": round(m["repetition"], 4)}
        m = task.response_metrics(prompts, texts)  # the demo's own definitions (well_formed = parses)
        result[name] = {"well_formed": round(m["well_formed"], 4), "repetition": round(m["repetition"], 4),
                        "mean_length": round(m["length"], 2), "by_length": by_length}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
