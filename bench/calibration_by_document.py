"""Analysis (issue 12): does the calibration's compute factor generalize across documents?

The compute factor alone (``rlperf.calibration.PARAMS["compute"]``, its grid ``FACTORS`` and the
fit's loss, the mean |ln(predicted / measured)|) is fitted on the calibration cases of all but
one source document and scored on the one left out; the hold-out step times are scored with
each fit too. Every grid point simulates the fit and hold-out cases once (published or unused
lengths: cheap), so the whole table costs about a minute of CPU.

Run: .venv/bin/python bench/calibration_by_document.py (figures: docs/validation.md, Calibration)
"""

from __future__ import annotations

import math
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from rlperf.calibration import FACTORS, as_scale, fit_cases
from rlperf.validate import CaseResult, run_cases
from rlperf.validation_cases import load_cases


def main() -> None:
    cf = load_cases()
    fit = fit_cases(cf.cases)
    hold = [c for c in cf.cases if c.split == "holdout" and c.spec.lengths in ("published", "not_used")]
    url = {c.id: c.spec.source_url for c in fit}
    docs = sorted(set(url.values()))
    print(f"{len(fit)} fit cases from {len(docs)} documents; {len(hold)} hold-out cases")
    res: dict[float, dict[str, CaseResult]] = {}
    with ProcessPoolExecutor(2) as pool:
        for f in FACTORS:
            res[f] = {r.id: r for r in run_cases(fit + hold, as_scale({"compute": f}), 2, pool=pool) if r.scored}

    def loss(f: float, ids: list[str]) -> float:
        return float(np.mean([res[f][i].log_error for i in ids if i in res[f]]))

    def best(ids: list[str]) -> float:  # ties keep the factor nearest 1, as the fit does
        return float(min(FACTORS, key=lambda f: (round(loss(f, ids), 9), abs(math.log(f)))))

    def median(f: float, ids: list[str]) -> float:
        return float(np.median([abs(res[f][i].error_pct) for i in ids if i in res[f]]))

    held_steps = [c.id for c in hold if c.spec.metric.kind == "step_time_s"]
    for d in docs:
        train = [i for i, u in url.items() if u != d]
        test = [i for i, u in url.items() if u == d]
        f = best(train)
        print(f"leave out {d}: compute x{f:g} ({len(test)} cases): left-out median |error| "
              f"{median(1.0, test):.1f}% -> {median(f, test):.1f}%; hold-out step times {median(f, held_steps):.1f}%")
    print(f"all documents: compute x{best(list(url)):g}")


if __name__ == "__main__":
    main()
