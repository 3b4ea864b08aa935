"""Re-export of ``dpfed.sensitivity`` (the arithmetic moved there so that the aggregator can
compute the noise a contribution must declare without importing the site's code). Old imports
keep working: ``from site_node.sensitivity import noise_calibration`` etc."""

from dpfed.sensitivity import (  # noqa: F401
    DEFAULT_BUDGET_SPLIT, DEFAULT_SPLIT_ADD_REMOVE, NEIGHBOURING, XTX_SENSITIVITIES,
    NoiseCalibration, check_neighbouring, check_xtx_rule, default_budget_split, expected_noise,
    n_sensitivity, noise_calibration, validate_privacy_parameters, xtx_sensitivity,
    xtx_sensitivity_tight, xty_sensitivity, yty_sensitivity)
from dpfed.sensitivity import __all__  # noqa: F401
