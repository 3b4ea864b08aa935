"""The federation's offline certificate authority (``dpfed provision``, ``dpfed csr``).

An application, not a role: the running site node, aggregator and coordinator never import it
(an import-linter contract in pyproject.toml forbids it). What they need at run time (identity
URIs, checks of their own TLS files, the reader of the CA's revocation list) is in the core,
``dpfed.identity``.

- ``project``: project.toml, the federation and its parties (``Project``, ``load_project``).
- ``authority``: the CA's key and certificate, issuing, signing the revocation list.
- ``layout``: where the CA's output folder keeps what (``kit_dir``, ``kit_tls``, ...).
- ``kits``: one kit per party (``provision``).
- ``requests``: certificate requests made at the party (``make_request``, ``load_request``).
- ``records``: every certificate issued, renewal and revocation (``renew``, ``revoke``).
- ``templates`` and templates/: the config files and START.md a kit carries.
"""

from dpfed.identity import AGGREGATOR, COORDINATOR, KINDS, SITE
from dpfed_apps.ca.authority import CertificateAuthority
from dpfed_apps.ca.kits import ProvisionReport, provision
from dpfed_apps.ca.layout import (CRL_NAME, aggregator_key_path, crl_path, kit_dir, kit_tls,
                                  public_dir)
from dpfed_apps.ca.project import (CA_DAYS, DEFAULT_CERT_DAYS, DEFAULT_POLICY, Project,
                                   ProvisionError, load_project, project_from_dict)
from dpfed_apps.ca.records import issued_certificates, renew, revoke
from dpfed_apps.ca.requests import (CSR_SUFFIX, Request, load_request, make_request,
                                    request_for_existing_key)

__all__ = ["AGGREGATOR", "COORDINATOR", "KINDS", "SITE", "CertificateAuthority",
           "ProvisionReport", "provision", "CRL_NAME", "aggregator_key_path", "crl_path",
           "kit_dir", "kit_tls",
           "public_dir", "CA_DAYS", "DEFAULT_CERT_DAYS", "DEFAULT_POLICY", "Project",
           "ProvisionError", "load_project", "project_from_dict", "issued_certificates", "renew",
           "revoke", "CSR_SUFFIX", "Request", "load_request", "make_request",
           "request_for_existing_key"]
