"""One visitor's request to a running demo app, through gradio_client, as a page's would be.

    python tools/ci/first_request.py URL [--model NAME] [--timeout S]

Sends the getting-started example (greedy beside prompt lookup, a few new tokens) to the app's
``/compare`` endpoint, waits for it to finish and checks the answer: every method done, prompt lookup's
text identical to greedy's. Exits non-zero with the app's own message otherwise. Used by
tools/ci/fresh_machine.sh on a machine with nothing cached.
"""

from __future__ import annotations

import argparse
import sys
import time

PROMPT = ("Rewrite this sentence with 'cat' in place of 'dog': The dog sat on the mat, and the dog slept "
          "there all afternoon.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    from gradio_client import Client

    start = time.perf_counter()
    client = Client(args.url, verbose=False)
    job = client.submit(prompt=PROMPT, model=args.model, methods=["prompt-lookup"],
                        max_new_tokens=args.max_new_tokens, sample=False, temperature=0.7, seed=0, concurrent=False,
                        api_name="/compare")
    out = job.result(timeout=args.timeout)
    status, results = out[0], out[-1]
    seconds = time.perf_counter() - start
    methods = (results or {}).get("methods") or []
    print(f"status: {status}")
    for m in methods:
        print(f"  {m.get('method')}: {m.get('new_tokens')} tokens, tau {m.get('tau')}, "
              f"identical to the baseline: {m.get('identical_to_baseline')} | {m.get('text')!r}")
    problems = []
    if not str(status).startswith("Done"):
        problems.append(f"the run did not finish: {status!r}")
    if len(methods) != 2:
        problems.append(f"expected greedy and prompt lookup, got {[m.get('method') for m in methods]}")
    elif methods[1].get("output_ids") != methods[0].get("output_ids") or not methods[0].get("output_ids"):
        problems.append("prompt lookup's tokens differ from greedy's (or no tokens)")
    if problems:
        print("FAILED: " + "; ".join(problems), file=sys.stderr)
        return 1
    print(f"one request answered in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
