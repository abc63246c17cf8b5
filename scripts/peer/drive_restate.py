"""Drives the peer benchmark on Restate: R invocations of `loop/run` with N steps each, all
at once through Restate's ingress (as `baton bench --runs R --iterations N` creates R runs
through Baton's API), and prints one JSON line: steps per second, wall time, and the CPU
the server and the service took per step (from /proc, for the pids given).

usage: drive_restate.py INGRESS_URL RUNS ITERATIONS [PID...]"""

import json
import os
import sys
import threading
import time
import urllib.request


def with_descendants(pids):
    """The processes and every process below them (hypercorn's workers, say)."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                pass
    found, todo = set(), list(pids)
    while todo:
        p = todo.pop()
        if p not in found:
            found.add(p)
            todo.extend(c for c, pp in parent.items() if pp == p)
    return sorted(found)


def cpu_s(pids):
    """User + system CPU seconds of the processes and their reaped children."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        # after the command: state(0) ... utime(11) stime(12) cutime(13) cstime(14)
        total += sum(int(fields[i]) for i in (11, 12, 13, 14))
    return total / tick


def main():
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    url, runs, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    pids = with_descendants([int(p) for p in sys.argv[4:]])
    results, errors = [None] * runs, []

    def invoke(k):
        req = urllib.request.Request(
            f"{url}/loop/run",
            data=json.dumps(n).encode(),
            headers={"content-type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=3600) as resp:
                results[k] = json.load(resp)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"invocation {k}: {e}")

    cpu0, t0 = cpu_s(pids), time.monotonic()
    threads = [threading.Thread(target=invoke, args=(k,)) for k in range(runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.monotonic() - t0, cpu_s(pids) - cpu0
    if errors or any(r != 1024 * n for r in results):
        print(json.dumps({"errors": errors[:5], "wrong": sum(r != 1024 * n for r in results)}))
        sys.exit(1)
    steps = runs * n
    print(json.dumps({
        "peer": "restate",
        "runs": runs,
        "iterations": n,
        "wall_s": round(wall, 3),
        "steps": steps,
        "steps_per_s": round(steps / wall),
        "cpu_ms_per_step": round(cpu * 1000 / steps, 3) if pids else None,
        "all_completed": True,
    }))


if __name__ == "__main__":
    main()
