"""The audit log's source address follows `ogai.request_context.client_ip`: X-Forwarded-For
only from a trusted proxy, so a client cannot write someone else's address into the log."""

from infra_os.models import AuditEvent


def test_the_audit_log_takes_the_address_by_the_same_rule(api, world, settings):
    settings.OGAI_USE_X_FORWARDED_FOR = True
    settings.OGAI_TRUSTED_PROXIES = ["10.0.0.1/32"]
    client = api.as_user(world.alpha_member)
    spoofed = client.post("/api/v1/infra-os/api-tokens/", {"name": "direct"}, format="json",
                          REMOTE_ADDR="203.0.113.9", HTTP_X_FORWARDED_FOR="192.0.2.1")
    assert spoofed.status_code == 201
    proxied = client.post("/api/v1/infra-os/api-tokens/", {"name": "proxied"}, format="json",
                          REMOTE_ADDR="10.0.0.1",
                          HTTP_X_FORWARDED_FOR="192.0.2.1, 198.51.100.7")
    assert proxied.status_code == 201
    events = AuditEvent.objects.filter(action="api_token.create").order_by("pk")
    assert [event.source_ip for event in events] == ["203.0.113.9", "198.51.100.7"]
