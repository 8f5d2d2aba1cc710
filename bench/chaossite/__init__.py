"""The Django project in which bench/chaos.py runs its workers under faults."""
