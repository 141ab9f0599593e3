"""The operating characteristics of the verdict procedure, by simulation (the table in docs/sweeps.md).

  python scripts/plan_characteristics.py        # 2,000 simulated pilots per row, about two minutes

Each row simulates the whole procedure for one finding tested alone: a pilot of 5 normal paired differences (mean
'truth', sd 'sd'), its plan (pilot effect, the sd's 80% upper limit, chance of a verdict at 5 seeds), and -- when the
plan makes it confirmatory -- a verdict run of 5 fresh seeds judged by the verdict interval. Columns: the share of
pilots that made the finding confirmatory, that ended in a confirmatory verdict, in each verdict, and in a false
claim (a verdict the truth contradicts: the type-I error). ``attn_lab.reporting.plan.operating_characteristics``
is what tests/test_plan.py bounds.
"""

from attn_lab.markdown import markdown_table
from attn_lab.reporting import plan

MARGIN = 1.0  # every number in units of the margin
ROWS = [("up", 0.25), ("up", 0.5), ("up", 1.0), ("not_worse", 0.5), ("same", 0.5)]
TRUTHS = {"up": (0.0, 0.5, 1.0, 2.0), "not_worse": (0.0, -0.5, -1.0, -2.0), "same": (0.0, 0.5, 1.0, 2.0)}

if __name__ == "__main__":
    rows = []
    for direction, sd in ROWS:
        for truth in TRUTHS[direction]:
            oc = plan.operating_characteristics(direction, MARGIN, sd, truth, pilots=2000)
            rows.append([direction, f"{sd:g} m", f"{truth:+g} m", f"{oc['confirmatory']:.2f}", f"{oc['verdict']:.2f}",
                         f"{oc['reproduced']:.2f}", f"{oc['smaller than published']:.2f}",
                         f"{oc['not reproduced']:.2f}", f"{oc['false_claim']:.3f}"])
    print(markdown_table(["finding", "sd", "true effect", "confirmatory", "verdict", "reproduced",
                          "smaller than published", "not reproduced", "false claim"], rows))
