"""Security: TLS settings, principals and their API keys, SCRAM, the authorizer (ACLs),
the audit log and quotas. ``security/`` decides; the gate in ``server/`` enforces.
"""
