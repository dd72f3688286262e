"""Render the chaos suite's JSON figures as the table in docs/reliability.md.

    python -m tests.chaos.render RESULTS_DIR [RESULTS_DIR...] docs/reliability.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

BEGIN, END = "<!-- chaos-figures:begin -->", "<!-- chaos-figures:end -->"
ORDER = ["driver-kill-read", "driver-kill-write", "worker-kill-batch", "worker-kill-stream-read",
         "worker-kill-stream-write", "broker-restart", "local-lock", "local-disk-full", "bad-input",
         "bad-input-cli", "soak"]


def _notes(r: dict) -> str:
    skip = {"rows_unexpected"}
    def short(v: object) -> str:
        text = str(v)
        return text if len(text) <= 60 else "…" + text[-57:]

    return ", ".join(f"{k}={short(v)}" for k, v in sorted(r["extra"].items()) if k not in skip and k != "note")


def table(results: list[dict]) -> str:
    results = sorted(results, key=lambda r: (ORDER.index(r["fault"]) if r["fault"] in ORDER else 99, r["backend"]))
    lines = ["| fault | backend | size | injected | rows expected | lost | duplicated | recovery s (mean / max) "
             "| notes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        rec = "—" if r["recovery_max_s"] is None else f"{r['recovery_mean_s']} / {r['recovery_max_s']}"
        lines.append(f"| {r['fault']} | {r['backend']} | {r['size']} | {r['injected']} | {r['rows_expected']} | "
                     f"{r['rows_lost']} | {r['rows_duplicated']} | {rec} | {_notes(r)} |")
    runs = sorted({(r["size"], r["seed"]) for r in results})
    when = max(r["at"] for r in results) if results else "—"
    head = ", ".join(f"size `{s}`, seed {seed}" for s, seed in runs)
    return f"Run: {head}; finished {when}.\n\n" + "\n".join(lines)


def main(argv: list[str]) -> int:
    dirs, doc = [Path(a) for a in argv[:-1]], Path(argv[-1])
    results = [json.loads(p.read_text()) for d in dirs for p in sorted(d.glob("*.json"))]
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{doc}: markers {BEGIN} / {END} not found")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(f"{head}{BEGIN}\n{table(results)}\n{END}{tail}")
    print(f"{doc}: {len(results)} results from {', '.join(map(str, dirs))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
