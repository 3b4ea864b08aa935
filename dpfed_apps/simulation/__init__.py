"""A whole federation on one machine: an aggregator and K site nodes as separate processes.

``run_simulation`` splits a data set (by default the bundled GDSC v17 responses of one drug)
into held-out test lines, a few public lines and K private site data sets; writes each site
its own CSV, signing key and ``site.toml``; starts ``dpfed aggregator serve`` and K
``dpfed site serve`` processes talking real gRPC on loopback; runs one round through the
coordinator client; and scores the private model against two baselines on the test lines:

- non-private: the same model fitted on the exact statistics of every training row (all sites
  plus the public lines), same public pre-processing, no clipping, no noise;
- public only: the model fitted on the public lines alone (what a site-less coordinator has).

The in-process parts (loading, splitting, public pre-processing and bounds, baselines,
scoring, the report) are pure functions so they can be tested without processes.
Everything the coordinator uses (means, sigmas, bounds) comes from the public lines or from
public sizes n (bounded DP: n is public), never from the sites' private rows.
"""

from dpfed.preprocess import public_sigmas
from dpfed.tomlwriter import to_toml
from dpfed_apps.simulation.federation import (COORDINATOR_ID, FederationFailed, FederationLayout,
                                              LocalFederation, round_config, write_federation,
                                              write_rows_csv)
from dpfed_apps.simulation.problem import (ID_COLUMN, Problem, Split, csv_problem, gdsc_problem,
                                           site_ids, split_rows)
from dpfed_apps.simulation.public import public_preprocessing, round_bounds
from dpfed_apps.simulation.report import format_report
from dpfed_apps.simulation.run import (DEFAULT_EPSILON, DEFAULT_PUBLIC, DEFAULT_SITES, DEFAULT_TEST,
                                       SimulationOptions, load_problem, run_simulation)
from dpfed_apps.simulation.scoring import (FittedModel, baseline_models, feature_table, fit_model,
                                           model_from_result, test_spearman, training_statistics)
