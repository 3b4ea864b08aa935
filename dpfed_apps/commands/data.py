"""dpfed data: write the bundled GDSC data as hospital data files and a public file."""

from __future__ import annotations

import sys

from dpfed import exitcodes
from dpfed_apps.commands import add_command

EPILOG = """\
For demos and deployment tests: the bundled GDSC v17 cell lines of one drug, split at random
(one seed decides everything, so the same arguments write the same files byte for byte)
into disjoint sets: one private file per site, a public file, and held-out test lines.

example:
  dpfed data export --drug 1047 --sites hospital-a,hospital-b,hospital-c --out data/
      data/hospital-a.csv ...  each hospital's private rows (COSMIC_ID, features, target)
      data/public.csv          public rows for round.toml's [public] path
      data/test.csv            held-out lines no party sees (to check a result)
      data/features.txt        the feature names, for round.toml's `features`
  Columns: COSMIC_ID, the default features (the public rule of dpfed.datasets: the 5 most
  frequent mutations and 5 most common tissues) or --features, then Drug_<id>_IC50 (ln IC50).
"""


def export(args) -> int:
    import json
    from pathlib import Path

    from dpfed import datasets
    from dpfed.identity import IdentityError, check_name
    from dpfed_apps.simulation.federation import write_rows_csv
    from dpfed_apps.simulation.problem import gdsc_problem, split_rows

    sites = [s.strip() for s in args.sites.split(",") if s.strip()]
    try:
        for s in sites:
            check_name(s, "site id")
        if len(set(sites)) != len(sites) or not sites:
            raise IdentityError("--sites must name distinct sites")
        features = ([f.strip() for f in args.features.split(",") if f.strip()]
                    if args.features else None)
        problem = gdsc_problem(args.drug, features)
        split = split_rows(problem.n, n_sites=len(sites), n_public=args.public,
                           n_test=args.test, seed=args.seed)
    except (KeyError, ValueError) as exc:
        print(f"dpfed data export: {exc.args[0] if isinstance(exc, KeyError) else exc}",
              file=sys.stderr)
        return exitcodes.USAGE
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for site, rows in zip(sites, split.sites):
        write_rows_csv(out / f"{site}.csv", problem, rows)
        print(f"{out / (site + '.csv')}: {rows.size} rows (private to {site})")
    write_rows_csv(out / "public.csv", problem, split.public)
    write_rows_csv(out / "test.csv", problem, split.test)
    (out / "features.txt").write_text("\n".join(problem.feature_names) + "\n")
    print(f"{out / 'public.csv'}: {split.public.size} public rows; {out / 'test.csv'}: "
          f"{split.test.size} held-out rows")
    print(f"target = {json.dumps(problem.target)}   # {datasets.drug_label(args.drug)}, ln IC50")
    print(f"features = {json.dumps(list(problem.feature_names))}")
    return exitcodes.OK


def register(subparsers) -> None:
    p = add_command(subparsers, "data", __doc__,
                    help="write bundled GDSC data as site and public files", epilog=EPILOG)
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    e = sub.add_parser("export", help="one CSV per site, a public CSV and held-out test lines",
                       epilog=EPILOG)
    e.add_argument("--drug", type=int, default=1047, help="GDSC drug id (default 1047, Nutlin-3a)")
    e.add_argument("--sites", required=True, help="comma-separated site ids, one file each")
    e.add_argument("--public", type=int, default=50, help="public rows (default 50)")
    e.add_argument("--test", type=int, default=100, help="held-out rows (default 100)")
    e.add_argument("--seed", type=int, default=1, help="seed of the split (default 1)")
    e.add_argument("--features", help="comma-separated feature names (default: the public rule)")
    e.add_argument("--out", required=True, help="folder for the CSV files")
    e.set_defaults(func=export)
