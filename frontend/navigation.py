"""The console's navigation: one section per layer."""

from dataclasses import dataclass

from django.urls import reverse

from infra_os.access import is_platform_admin


@dataclass(frozen=True)
class NavItem:
    label: str
    url_name: str
    # Other pages under this item, so it stays highlighted there.
    also_for: tuple[str, ...] = ()
    # Shown to platform admins only, in a section everyone sees.
    operators_only: bool = False

    @property
    def url(self) -> str:
        return reverse(self.url_name)

    def is_active(self, view_name: str) -> bool:
        return view_name == self.url_name or view_name in self.also_for


@dataclass(frozen=True)
class NavLink:
    label: str
    url: str
    active: bool


@dataclass(frozen=True)
class NavSection:
    label: str
    layer: str
    items: tuple[NavItem, ...]
    # Shown to platform admins only (the pages answer 403 to others anyway).
    operators_only: bool = False


@dataclass(frozen=True)
class NavSectionLinks:
    label: str
    layer: str
    links: tuple[NavLink, ...]


SECTIONS = (
    NavSection("Computing centre", "L0", (
        NavItem("Dashboard", "frontend:dashboard"),
        NavItem("Tenants", "frontend:tenants",
                ("frontend:tenant-create", "frontend:tenant-edit")),
        NavItem("Members", "frontend:members", ("frontend:member-add", "frontend:member-invite")),
        NavItem("Invitations", "frontend:invitations"),
        NavItem("Quotas", "frontend:quotas", ("frontend:quota-edit",)),
        NavItem("Leases", "frontend:leases", ("frontend:lease-create",)),
        NavItem("API tokens", "frontend:tokens"),
        NavItem("Audit log", "frontend:audit"),
        NavItem("Usage", "frontend:usage"),
        NavItem("Invoices", "frontend:invoices", ("frontend:invoice",)),
        NavItem("Pricing", "frontend:pricing",
                ("frontend:pricing-plan", "frontend:pricing-plan-create",
                 "frontend:reservation-create")),
    )),
    NavSection("Bare metal", "L0", (
        NavItem("Servers", "frontend:servers",
                ("frontend:server", "frontend:server-register", "frontend:server-import",
                 "frontend:server-bulk", "frontend:server-edit", "frontend:server-bmc",
                 "frontend:racks", "frontend:rack-create")),
        NavItem("Provisioning", "frontend:provisioning",
                ("frontend:batch", "frontend:batch-create", "frontend:profiles",
                 "frontend:profile-create", "frontend:profile-edit")),
    ), operators_only=True),
    NavSection("Clusters", "L1", (
        NavItem("Clusters", "frontend:clusters",
                ("frontend:cluster", "frontend:cluster-create", "frontend:node",
                 "frontend:cluster-accounts")),
        NavItem("Fleets", "frontend:fleets", ("frontend:fleet",), operators_only=True),
        NavItem("Stack profiles", "frontend:stack-profiles",
                ("frontend:stack-profile-create", "frontend:stack-profile-edit"),
                operators_only=True),
        # "Stack runs", not "Deployments": that is the Models section's model deployments.
        NavItem("Stack runs", "frontend:deployment-runs",
                ("frontend:deployment-run", "frontend:deployment-run-create"),
                operators_only=True),
    )),
    NavSection("Jobs", "L2", (
        NavItem("Jobs", "frontend:jobs", ("frontend:job", "frontend:job-submit")),
        NavItem("Logs", "frontend:logs"),
        NavItem("Queues", "frontend:queues",
                ("frontend:queue", "frontend:queue-create", "frontend:queue-edit")),
        NavItem("Notebooks", "frontend:notebooks",
                ("frontend:notebook", "frontend:notebook-start")),
    )),
    NavSection("Toolchain", "L3", (
        NavItem("Datasets", "frontend:datasets",
                ("frontend:dataset", "frontend:dataset-create", "frontend:dataset-upload")),
        NavItem("Pipelines", "frontend:pipeline-runs",
                ("frontend:pipeline-run", "frontend:pipeline-builder")),
        NavItem("Training", "frontend:training-runs",
                ("frontend:training-run", "frontend:training-run-start")),
    )),
    NavSection("Models", "L4", (
        NavItem("Models", "frontend:models",
                ("frontend:model", "frontend:model-version", "frontend:model-register",
                 "frontend:model-import", "frontend:model-import-detail")),
        NavItem("Evaluations", "frontend:evaluations",
                ("frontend:evaluation-start", "frontend:evaluation-run",
                 "frontend:evaluation-samples", "frontend:benchmarks")),
        NavItem("Deployments", "frontend:deployments",
                ("frontend:deployment", "frontend:deployment-create")),
        NavItem("Playground", "frontend:playground"),
    )),
)


def navigation(request) -> list[NavSectionLinks]:
    match = getattr(request, "resolver_match", None)
    view_name = match.view_name if match else ""
    operator = is_platform_admin(request.user)
    return [
        NavSectionLinks(
            section.label, section.layer,
            tuple(NavLink(item.label, item.url, item.is_active(view_name))
                  for item in section.items if operator or not item.operators_only),
        )
        for section in SECTIONS
        if operator or not section.operators_only
    ]
