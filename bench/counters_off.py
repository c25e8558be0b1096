"""A copy of this tree without the message counters and samples: the baseline for
``bench/http_cost.py --perf-baseline``.

lavinpy has no switch for its counters (plain additions where the events happen: a check at each
would cost what it saves), so the baseline is this commit with every counter addition on the
model's paths replaced by ``pass``, the message-size histogram's calls removed and the periodic
sampler left idle. The C extensions are built in the copy, so both sides run the compiled path.
Prints what it removed; the copy is for measuring only (its API shows zeros).

    python bench/counters_off.py /tmp/lavinpy-counters-off [--rev HEAD]
"""

from __future__ import annotations

import argparse
import io
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# `x.stats.deliver += 1`, `vhost_stats.publish += run`, `counters.size_buckets[...] += 1`, `counters.size_sum += n`.
COUNTER_ADDITION = re.compile(r"^(?P<indent>\s*)[\w.]*(stats|counters)\.\w+(\[.*\])? \+= .*$", re.M)
SIZE_CALL = re.compile(r"^(?P<indent>\s*)observe_run\(.*\)$", re.M)
SAMPLER_TICK = "            await asyncio.sleep(self.interval)\n            self.sample()\n"


def strip(source: str) -> tuple[str, int]:
    count = 0

    def to_pass(match: re.Match) -> str:
        nonlocal count
        count += 1
        return f"{match['indent']}pass  # counter removed for the baseline"

    source = COUNTER_ADDITION.sub(to_pass, source)
    source = SIZE_CALL.sub(to_pass, source)
    return source, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--rev", default="HEAD")
    args = parser.parse_args()
    if args.dest.exists() and any(args.dest.iterdir()):
        raise SystemExit(f"{args.dest} is not empty")
    args.dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", args.rev], check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(args.dest, filter="data")
    total = 0
    for path in sorted((args.dest / "lavinpy").rglob("*.py")):
        text = path.read_text()
        if path.name == "stats.py" and path.parent.name == "broker":  # the sampler's tick only
            count = text.count(SAMPLER_TICK)
            text = text.replace(SAMPLER_TICK, "            await asyncio.sleep(self.interval)\n")
        else:
            text, count = strip(text)
        if count:
            path.write_text(text)
            print(f"{path.relative_to(args.dest)}: {count} removed")
            total += count
    subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=args.dest, check=True,
                   capture_output=True)
    check = subprocess.run([sys.executable, "-c", "import lavinpy.server, lavinpy.store.accel as s, "
                            "lavinpy.wire.accel as w; print(s.COMPILED)"], cwd=args.dest, capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": str(args.dest)})
    if check.returncode or check.stdout.strip() != "True":
        raise SystemExit(f"the copy does not import with the compiled path: {check.stderr[-800:]}")
    print(f"{total} counter sites removed; baseline ready in {args.dest}")


if __name__ == "__main__":
    main()
