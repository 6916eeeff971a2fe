"""Specs: small frozen value objects, validated once at the edge."""
