"""L0, the computing-centre OS: tenants, members and roles, API tokens, quotas and the audit log."""
