from django.contrib import admin

from infra_os.models import ApiToken, AuditEvent, Invitation, Membership, Quota, Tenant


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


class QuotaInline(admin.StackedInline):
    model = Quota
    can_delete = False


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["name", "display_name", "is_active", "created_at"]
    list_filter = ["is_active"]
    search_fields = ["name", "display_name"]
    inlines = [QuotaInline, MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", "tenant"]
    search_fields = ["user__username", "tenant__name"]
    autocomplete_fields = ["user", "tenant"]


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin):
    list_display = ["username", "tenant", "role", "state", "invited_by", "created_at",
                    "expires_at"]
    list_filter = ["state", "role", "tenant"]
    search_fields = ["username", "tenant__name"]
    readonly_fields = ["tenant", "username", "role", "invited_by", "expires_at", "state",
                       "responded_at", "created_at"]

    def has_add_permission(self, request):
        # Invitations are sent, accepted and declined through the console or API, audited.
        return False


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    list_display = ["tenant", "gpus", "cpu_cores", "memory_gib", "storage_gib"]
    search_fields = ["tenant__name"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "prefix", "created_at", "expires_at", "last_used_at",
                    "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["name", "user__username", "prefix"]
    readonly_fields = ["prefix", "key_hash", "last_used_at", "revoked_at", "created_at"]

    def has_add_permission(self, request):
        # Tokens are issued through the console or API, where the secret is shown once.
        return False


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ["created_at", "actor_name", "tenant_name", "action", "object_repr",
                    "source_ip"]
    list_filter = ["action"]
    search_fields = ["actor_name", "tenant_name", "object_repr", "action"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
