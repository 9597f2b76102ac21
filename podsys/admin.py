"""Read-mostly admin views of PODsys: changes go through the console and the API, whose
services check the compatibility matrix, allocate UIDs and audit."""

from django.contrib import admin

from podsys.models import (
    ClusterGroup,
    ClusterUser,
    DeploymentRun,
    HealthCheckRun,
    StackProfile,
)


@admin.register(StackProfile)
class StackProfileAdmin(admin.ModelAdmin):
    list_display = ["name", "os_family", "driver_version", "cuda_version", "orchestrator",
                    "offline_mirror"]
    search_fields = ["name"]


@admin.register(DeploymentRun)
class DeploymentRunAdmin(admin.ModelAdmin):
    list_display = ["id", "cluster", "kind", "profile", "state", "check_mode", "created_at"]
    list_filter = ["kind", "state"]
    readonly_fields = ["stats", "rc", "extra_vars", "hosts"]


@admin.register(ClusterGroup)
class ClusterGroupAdmin(admin.ModelAdmin):
    list_display = ["name", "cluster", "gid", "is_active"]
    list_filter = ["cluster", "is_active"]


@admin.register(ClusterUser)
class ClusterUserAdmin(admin.ModelAdmin):
    list_display = ["username", "cluster", "uid", "is_active", "pushed_at"]
    list_filter = ["cluster", "is_active"]
    search_fields = ["username", "full_name"]


@admin.register(HealthCheckRun)
class HealthCheckRunAdmin(admin.ModelAdmin):
    list_display = ["check_name", "node", "severity", "state", "trigger", "created_at"]
    list_filter = ["check_name", "state", "severity"]
    readonly_fields = ["details"]
