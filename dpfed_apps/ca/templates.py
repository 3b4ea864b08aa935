"""The files a kit carries besides keys and certificates: site.toml, aggregator.toml,
coordinator.toml (the formats of docs/interfaces.md, what the roles' loaders parse) and
START.md. The text is in templates/ next to this module (package data); this module only
fills in the values, rendered as TOML (dpfed.tomlwriter) where they land in a TOML value.

Fields: ``{name}`` is the plain value (comments, paths, Markdown), ``{v[name]}`` the same value
as a TOML literal. A fragment used inside another template (the [tls] table, a [[sites]]
entry) is inserted without its final newline.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from dpfed.identity import AGGREGATOR, COORDINATOR, SITE
from dpfed.tomlwriter import toml_value
from dpfed_apps.ca.project import Project


@lru_cache(maxsize=None)
def template(name: str) -> str:
    """The text of templates/``name``."""
    return resources.files(__package__).joinpath("templates", name).read_text(encoding="utf-8")


def render(template_name: str, *, toml: dict | None = None, **fields) -> str:
    """templates/``template_name`` with ``fields`` filled in and ``toml`` as ``{v[key]}`` TOML
    literals."""
    return template(template_name).format(v={k: toml_value(x) for k, x in (toml or {}).items()},
                                          **fields)


def _tls_table(name: str) -> str:
    return render("tls.toml", name=name).rstrip("\n")


def site_entry(site_id: str) -> str:
    """The [[sites]] entry of aggregator.toml that registers ``site_id``."""
    return render("site-entry.toml", site_id=site_id, toml={"site_id": site_id})


def coordinator_entry(coord_id: str) -> str:
    """The [[coordinators]] entry of aggregator.toml that registers ``coord_id``."""
    return render("coordinator-entry.toml", coord_id=coord_id, toml={"coordinator_id": coord_id})


def site_toml(project: Project, site_id: str, coordinators: list[str]) -> str:
    p = project.site_policy
    return render("site.toml", site_id=site_id, federation=project.federation,
                  tls=_tls_table(site_id), toml={
                      "site_id": site_id, "aggregator": project.aggregator_address,
                      "trusted_coordinators": [f"keys/{c}.pub" for c in coordinators],
                      "max_epsilon_per_round": float(p["max_epsilon_per_round"]),
                      "total_epsilon": float(p["total_epsilon"]), "min_n": int(p["min_n"]),
                      "allowed_targets": list(p["allowed_targets"]),
                      "allowed_features": list(p["allowed_features"])})


def aggregator_toml(project: Project, sites: list[str], coordinators: list[str]) -> str:
    entries = "\n".join([*(site_entry(s) for s in sites),
                         *(coordinator_entry(c) for c in coordinators)])
    return render("aggregator.toml", federation=project.federation,
                  tls=_tls_table(AGGREGATOR), entries=entries.rstrip("\n"),
                  toml={"listen": project.listen})


def coordinator_toml(project: Project, coord_id: str) -> str:
    return render("coordinator.toml", coord_id=coord_id, federation=project.federation,
                  tls=_tls_table(coord_id),
                  toml={"aggregator": project.aggregator_address, "coordinator_id": coord_id})


_START = {SITE: "START-site.md", AGGREGATOR: "START-aggregator.md",
          COORDINATOR: "START-coordinator.md"}


def start_md(kind: str, **fields) -> str:
    """START.md of a kit of ``kind``: what the party does with the folder."""
    return render(_START[kind], **fields)
