from django.db import models

from infra_os.choices import ServerAllocation, ServerState
from infra_os.models.tenancy import slug_validator
from ogai.models import TimeStampedModel


class Rack(TimeStampedModel):
    name = models.CharField(max_length=63, unique=True, validators=[slug_validator],
                            error_messages={"unique": "A rack with this name already exists."})
    location = models.CharField(max_length=200, blank=True, help_text="Room, row, position")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Server(TimeStampedModel):
    """A bare-metal server the computing centre owns. What its BMC last reported is copied here
    (power, health, GPUs) so lists and billing read it without the snapshot history."""

    name = models.CharField(max_length=63, unique=True, validators=[slug_validator],
                            error_messages={"unique": "A server with this name already exists."})
    rack = models.ForeignKey(Rack, on_delete=models.SET_NULL, null=True, blank=True,
                             related_name="servers")
    description = models.CharField(max_length=200, blank=True)
    expected_gpu_model = models.CharField(max_length=64, blank=True)
    expected_gpu_count = models.PositiveIntegerField(default=0)
    state = models.CharField(max_length=16, choices=ServerState.choices,
                             default=ServerState.REGISTERED)
    allocation = models.CharField(max_length=16, choices=ServerAllocation.choices,
                                  default=ServerAllocation.FREE)
    allocated_to = models.CharField(max_length=100, blank=True,
                                    help_text='e.g. the cluster it is a node of')
    # From the newest inventory.
    power_state = models.CharField(max_length=16, blank=True)
    health = models.CharField(max_length=16, blank=True)
    gpu_model = models.CharField(max_length=64, blank=True)
    gpu_count = models.PositiveIntegerField(default=0)
    mismatches = models.JSONField(default=list, blank=True)
    console_url = models.URLField(max_length=500, blank=True)
    # The NIC it network-boots from: a first-boot agent asks for its config by this MAC. Given
    # at registration, else the first NIC of the inventory.
    boot_mac = models.CharField(max_length=17, blank=True, db_index=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # The newest BMC failure in the BMC's own words (credentials never appear here).
    bmc_error = models.TextField(blank=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=models.Q(state__in=ServerState.values),
                                   name="server_state_valid"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def billed_gpu_model(self) -> str:
        return self.gpu_model or self.expected_gpu_model

    @property
    def billed_gpu_count(self) -> int:
        return self.gpu_count or self.expected_gpu_count


class Bmc(TimeStampedModel):
    """How OGAI reaches a server's baseboard management controller."""

    server = models.OneToOneField(Server, on_delete=models.CASCADE, related_name="bmc")
    driver = models.CharField(max_length=32, default="redfish")
    address = models.URLField(max_length=255, help_text="e.g. https://10.0.0.5")
    system_id = models.CharField(
        max_length=255, blank=True,
        help_text="The Redfish system's id when the BMC manages several; empty: its only one")
    verify_tls = models.BooleanField(default=True)
    username = models.CharField(max_length=128, editable=False)
    # The password, encrypted with `ogai.crypto`: never returned, logged or audited.
    password_encrypted = models.TextField(editable=False)

    class Meta:
        ordering = ["server__name"]

    def __str__(self) -> str:
        return f"BMC of {self.server.name}"


class InventorySnapshot(models.Model):
    """What the BMC reported at one moment; `data` holds the parsed inventory (system, cpus,
    memory, gpus, nics, disks), `missing` the sections the BMC did not report."""

    server = models.ForeignKey(Server, on_delete=models.CASCADE, related_name="inventories")
    taken_at = models.DateTimeField(auto_now_add=True, db_index=True)
    power_state = models.CharField(max_length=16, blank=True)
    health = models.CharField(max_length=16, blank=True)
    data = models.JSONField(default=dict)
    missing = models.JSONField(default=list, blank=True)
    mismatches = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-taken_at", "-id"]

    def __str__(self) -> str:
        return f"Inventory of {self.server.name} at {self.taken_at:%Y-%m-%d %H:%M}"

