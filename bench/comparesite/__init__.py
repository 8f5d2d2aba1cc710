"""The Django project in which bench/compare.py runs all three task systems."""
