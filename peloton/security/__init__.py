"""Security at the daemon's edge: TLS, who calls (certificates, tokens, JWTs), what they may do."""
