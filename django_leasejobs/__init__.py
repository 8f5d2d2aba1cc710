"""Database-backed django.tasks backend with row leases and fenced writes."""
