"""The sweep's subprocess entry point: ``python -m fourfold.apps.experiments evaluate SPEC.json |
prepare-demo DEMO.yaml | credit SPEC.json | bon-curve SPEC.json | ppo-curve SPEC.json | turns-world SPEC.json |
turns-eval SPEC.json | goodhart-bon SPEC.json | goodhart-curve SPEC.json`` (started by
:func:`fourfold.apps.experiments.run`, one job at a time)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

from fourfold.apps.experiments.final_eval import evaluate_spec, prepare_demo
from fourfold.errors import FourfoldError

USAGE = ("usage: python -m fourfold.apps.experiments evaluate SPEC.json | prepare-demo DEMO.yaml | credit SPEC.json"
         " | bon-curve SPEC.json | ppo-curve SPEC.json | turns-world SPEC.json | turns-eval SPEC.json"
         " | goodhart-bon SPEC.json | goodhart-curve SPEC.json")


def main(argv: Sequence[str]) -> int:
    """Run one subcommand; prints a one-line JSON summary. Exit status 2 on a usage or fourfold error."""
    if len(argv) != 2 or argv[0] not in ("evaluate", "prepare-demo", "credit", "bon-curve", "ppo-curve",
                                             "turns-world", "turns-eval", "goodhart-bon", "goodhart-curve"):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        if argv[0] == "evaluate":
            res = evaluate_spec(json.loads(Path(argv[1]).read_text(encoding="utf-8")))
            s = res["summary"]
            print(json.dumps({k: s[k] for k in ("proxy", "gold", "kl", "length", "well_formed", "repetition")}))
        elif argv[0] == "credit":
            from fourfold.apps.experiments.credit import credit_spec

            res = credit_spec(json.loads(Path(argv[1]).read_text(encoding="utf-8")))
            print(json.dumps({"views": [v["label"] for v in res["views"]], "K": res["K"]}))
        elif argv[0] in ("turns-world", "turns-eval"):
            from fourfold.apps.experiments import turns_eval

            fn = turns_eval.world_spec if argv[0] == "turns-world" else turns_eval.eval_spec
            res = fn(json.loads(Path(argv[1]).read_text(encoding="utf-8")))
            print(json.dumps({"gold": {m: g["gold"] for m, g in res["gold"].items()}, "seconds": res["seconds"]}))
        elif argv[0] in ("goodhart-bon", "goodhart-curve"):
            from fourfold.apps.experiments import goodhart_sample

            fn = goodhart_sample.bon_spec if argv[0] == "goodhart-bon" else goodhart_sample.curve_spec
            res = fn(json.loads(Path(argv[1]).read_text(encoding="utf-8")))
            print(json.dumps({"seconds": res["seconds"]}))
        elif argv[0] in ("bon-curve", "ppo-curve"):
            from fourfold.apps.experiments import overopt_eval

            fn = overopt_eval.bon_curve_spec if argv[0] == "bon-curve" else overopt_eval.ppo_curve_spec
            res = fn(json.loads(Path(argv[1]).read_text(encoding="utf-8")))
            print(json.dumps({"seconds": res["seconds"]}))
        else:
            res = prepare_demo(Path(argv[1]))
            print(json.dumps({k: res[k] for k in ("sft", "reward")}))
    except FourfoldError as e:
        print(f"fourfold experiments {argv[0]}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
